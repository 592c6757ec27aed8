"""Telling people and systems (SPEC §6): a job's notifications to its notify_url and its owner
(`notifications`) and where they may go (`receivers`), the Standard Webhooks signatures on what we
send and receive (`signed_webhooks`), and the providers' batch webhooks taken as hints
(`provider_hooks`)."""
