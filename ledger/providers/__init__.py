"""Provider adapters by name. Keys come only from the environment (SPEC §4)."""

import os

import httpx
from django.conf import settings

from .base import BatchProvider
from .openai import OpenAIBatchProvider

ADAPTERS = {"openai": OpenAIBatchProvider, "emulator": OpenAIBatchProvider}


def provider_names() -> list[str]:
    return sorted(ADAPTERS)


def get_provider(name: str) -> BatchProvider:
    if name not in ADAPTERS:
        raise KeyError(f"unknown provider {name!r}; known: {', '.join(provider_names())}")
    config = settings.PROVIDERS[name]
    api_key = os.environ.get(config["api_key_env"], "emulator-key" if name == "emulator" else "")
    client = httpx.Client(
        base_url=config["base_url"],
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=httpx.Timeout(60.0, connect=10.0),
    )
    return ADAPTERS[name](client=client)
