"""Emulators of each provider's wire protocol, for tests, the demo and `run_emulator`.

Each speaks its provider's real protocol over HTTP at the real paths, answers with `textgen`
instead of a model, and has fault switches (knobs) that make it misbehave the ways the real
provider does. `server.py` is the plumbing they share: the threaded HTTP server, routing, the
control endpoints (`/_emulator/config`, `/_emulator/stats`) and the common knobs.
"""

from django.utils.module_loading import import_string

PROTOCOLS = {
    "openai": "ledger.emulators.openai.Emulator",
    "anthropic": "ledger.emulators.anthropic.AnthropicEmulator",
    "cloudflare": "ledger.emulators.cloudflare.CloudflareEmulator",
    "gemini": "ledger.emulators.gemini.GeminiEmulator",
    "openai_compatible": "ledger.emulators.openai_compatible.CompatibleServerEmulator",
}


def emulator_class(protocol: str):
    if protocol not in PROTOCOLS:
        raise KeyError(f"unknown protocol {protocol!r}; known: {', '.join(sorted(PROTOCOLS))}")
    return import_string(PROTOCOLS[protocol])
