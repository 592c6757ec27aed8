"""Money (SPEC §9): what drafts cost at the providers' prices, in the business's currency, held against a job's budget, estimated before paid work starts, and what an import's rework costs."""
