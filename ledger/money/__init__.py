"""Money (SPEC §9): what drafts cost at the providers' prices (`pricing`), in the business's currency
(`currency`), held against a job's budget (`budgets`), and estimated before paid work starts
(`estimates`)."""
