"""Every provider BatchDesk speaks, each with the emulator of its wire protocol, as the tests start
them: fast, at the real paths, with only the settings and environment variables a deployment of
that provider sets (SPEC §4). Parametrise a test over `PROVIDERS` to run it for every provider."""

import contextlib
from dataclasses import dataclass, field

from ledger.emulators import emulator_class
from ledger.providers import capabilities


@dataclass(frozen=True)
class ProviderUnderTest:
    name: str  # as jobs name it
    protocol: str  # `run_emulator --protocol`
    base_url_env: str  # where a deployment names the provider's address
    credentials: dict[str, str]  # what a deployment sets beside it
    fast: dict = field(default_factory=dict)  # the emulator's quick pace, for tests
    model: str = "gpt-4o-mini"

    def __str__(self) -> str:
        return self.name

    @property
    def capabilities(self):
        return capabilities(self.name)

    def env(self, base_url: str) -> dict[str, str]:
        return {self.base_url_env: base_url, **self.credentials}


PROVIDERS = [
    ProviderUnderTest(
        "emulator",
        "openai",
        "BATCHDESK_EMULATOR_URL",
        {},
        {"per_request_ms": 1, "validating_ms": 10, "finalizing_ms": 5},
    ),
    ProviderUnderTest(
        "openai",
        "openai",
        "OPENAI_BASE_URL",
        {"OPENAI_API_KEY": "sk-test-openai"},
        {"per_request_ms": 1, "validating_ms": 10, "finalizing_ms": 5},
    ),
    ProviderUnderTest(
        "anthropic",
        "anthropic",
        "ANTHROPIC_BASE_URL",
        {"ANTHROPIC_API_KEY": "sk-ant-test"},
        {"per_request_ms": 1},
        model="claude-haiku-4-5",
    ),
    ProviderUnderTest(
        "cloudflare",
        "cloudflare",
        "CLOUDFLARE_API_BASE_URL",
        {"CLOUDFLARE_API_TOKEN": "cf-test-token", "CLOUDFLARE_ACCOUNT_ID": "acct0123"},
        {"per_request_ms": 1, "queued_ms": 10},
        model="@cf/meta/llama-3.3-70b-instruct-fp8-fast",
    ),
    ProviderUnderTest(
        "gemini",
        "gemini",
        "GEMINI_BASE_URL",
        {"GEMINI_API_KEY": "gemini-test-key"},
        {"per_request_ms": 1, "pending_ms": 10},
        model="gemini-2.5-flash",
    ),
    ProviderUnderTest(
        "openai_compatible",
        "openai_compatible",
        "OPENAI_COMPATIBLE_BASE_URL",
        {"OPENAI_COMPATIBLE_API_KEY": "local-test-key"},
        {"per_request_ms": 1},
        model="Qwen/Qwen2.5-7B-Instruct",
    ),
]
BY_NAME = {provider.name: provider for provider in PROVIDERS}
# One per wire protocol: `emulator` and `openai` share theirs.
ONE_PER_PROTOCOL = [provider for provider in PROVIDERS if provider.name != "emulator"]


def start_emulator(provider: ProviderUnderTest, *, seed: int = 0, **knobs):
    """The provider's emulator, started in this process with its quick pace; stop it when done."""
    emulator = emulator_class(provider.protocol)(seed=seed, **provider.fast, **knobs)
    emulator.start()
    return emulator


@contextlib.contextmanager
def serving(provider: ProviderUnderTest, settings, monkeypatch, *, seed: int = 0, **knobs):
    """Start the provider's emulator and point BatchDesk at it as a deployment would: its base URL
    and credentials (the settings read the URL once at start, so it is set there too)."""
    emulator = start_emulator(provider, seed=seed, **knobs)
    try:
        for name, value in provider.credentials.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv(provider.base_url_env, emulator.base_url)
        settings.PROVIDERS = {
            **settings.PROVIDERS,
            provider.name: {**settings.PROVIDERS[provider.name], "base_url": emulator.base_url},
        }
        yield emulator
    finally:
        emulator.stop()
