"""Provider adapters by name. Each builds its own client from `settings.PROVIDERS[name]`; keys
come only from the environment (SPEC §4)."""

import os

from django.conf import settings
from django.utils.module_loading import import_string

from ..models import DEFAULT_UNIT_SIZE
from .base import BatchProvider, Capabilities, Delivery

ADAPTERS = {
    "openai": "ledger.providers.openai.OpenAIBatchProvider",
    "emulator": "ledger.providers.openai.OpenAIBatchProvider",
    "anthropic": "ledger.providers.anthropic.AnthropicBatchProvider",
    "cloudflare": "ledger.providers.cloudflare.CloudflareBatchProvider",
    "gemini": "ledger.providers.gemini.GeminiBatchProvider",
    "openai_compatible": "ledger.providers.openai_compatible.CompatibleServerProvider",
}


def provider_names() -> list[str]:
    """Every provider BatchDesk has an adapter for."""
    return sorted(ADAPTERS)


def configured_provider_names() -> list[str]:
    """The providers a job may use here: those whose credentials are in the environment."""
    return [
        name
        for name in provider_names()
        if all(os.environ.get(variable) for variable in settings.PROVIDERS[name]["required_env"])
    ]


def adapter_class(name: str) -> type[BatchProvider]:
    if name not in ADAPTERS:
        raise KeyError(f"unknown provider {name!r}; known: {', '.join(provider_names())}")
    return import_string(ADAPTERS[name])


def capabilities(name: str) -> Capabilities:
    return adapter_class(name).capabilities


def answers_at_once(name: str) -> bool:
    """Whether the provider is a server answering each request as it is made: nothing waits
    there, and what refuses or slows a unit is the server itself."""
    return capabilities(name).delivery == Delivery.PER_REQUEST


def default_model(name: str) -> str:
    """The model a job of this provider uses when it names none."""
    return settings.PROVIDERS[name]["default_model"]


def default_unit_size(name: str) -> int:
    """Requests per unit when a job does not say: the usual size, within the provider's limit."""
    return min(DEFAULT_UNIT_SIZE, capabilities(name).max_requests)


def schema_dialect(name: str) -> str:
    """The dialect of output schema this provider is sent (SPEC rule 17, ledger/drafts/schema_dialects.py):
    the one its settings name (`openai_compatible`), else its adapter's."""
    return settings.PROVIDERS[name].get("schema_dialect") or adapter_class(name).schema_dialect


def get_provider(name: str) -> BatchProvider:
    adapter = adapter_class(name).from_settings(settings.PROVIDERS[name])
    adapter.name = name
    return adapter
