"""What happens to a unit's and a draft's data over time (SPEC §11): the provider's collect-by deadline, clean-up of the provider's files, and retention of unusable drafts' text."""
