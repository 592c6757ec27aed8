"""What an answer is (SPEC rules 2, 12, 17 and 19): what the ledger keeps of a provider's answer and
its size caps (`answers`), keys scrubbed out of it (`scrubbing`), the JSON values a column can hold
(`json_values`), each provider's schema dialect and how its answers read back (`schema_dialects`)
and where a schema may point (`schema_refs`), the one check that says whether a draft is usable
(`validation`) and the words of why not (`reasons`)."""
