"""What happens to a unit's and a draft's data over time (SPEC §11): the provider's collect-by deadline
(`deadlines`), clean-up of the provider's files (`provider_files`), and the retention of unusable
drafts' text (`retention`)."""
