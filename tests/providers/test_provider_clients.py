"""Every adapter builds its HTTP client through one builder (`http.provider_client`): the configured
base URL, the provider's credential header, the shared TLS context and its timeouts. These pin down
what each adapter's client is, so a change to the builder cannot quietly change one of them."""

import httpx
import pytest

from ledger.providers import get_provider
from ledger.providers.base import tls_context
from ledger.providers.http import CONNECT_TIMEOUT, configured_key, provider_client

CONFIG = {"base_url": "http://provider.test/v1", "api_key_env": "TEST_PROVIDER_KEY"}


def test_the_builder_sets_the_base_url_headers_timeouts_and_certificates():
    client = provider_client(CONFIG, headers={"x-key": "k1"}, read_timeout=42.0)
    assert client.base_url == "http://provider.test/v1/"
    assert client.headers["x-key"] == "k1"
    assert client.timeout == httpx.Timeout(42.0, connect=CONNECT_TIMEOUT)
    assert CONNECT_TIMEOUT == 10.0
    assert client._transport._pool._ssl_context is tls_context()


def test_the_builder_keeps_httpxs_connection_limits_unless_given_some():
    default = provider_client(CONFIG, headers={})
    assert default.timeout == httpx.Timeout(60.0, connect=10.0)
    assert default._transport._pool._max_connections == 100
    limited = provider_client(CONFIG, headers={}, limits=httpx.Limits(max_connections=3))
    assert limited._transport._pool._max_connections == 3


def test_the_key_is_read_from_the_environment_variable_the_settings_name(monkeypatch):
    monkeypatch.delenv("TEST_PROVIDER_KEY", raising=False)
    assert configured_key(CONFIG) == ""
    monkeypatch.setenv("TEST_PROVIDER_KEY", "sk-test")
    assert configured_key(CONFIG) == "sk-test"


@pytest.mark.parametrize(
    ("name", "key_env", "headers", "read_timeout"),
    [
        ("openai", "OPENAI_API_KEY", {"authorization": "Bearer k-1"}, 60.0),
        ("emulator", "BATCHDESK_EMULATOR_KEY", {"authorization": "Bearer k-1"}, 60.0),
        ("anthropic", "ANTHROPIC_API_KEY", {"x-api-key": "k-1", "anthropic-version": "2023-06-01"}, 60.0),
        ("cloudflare", "CLOUDFLARE_API_TOKEN", {"authorization": "Bearer k-1"}, 60.0),
        ("gemini", "GEMINI_API_KEY", {"x-goog-api-key": "k-1"}, 120.0),
        ("openai_compatible", "OPENAI_COMPATIBLE_API_KEY", {"authorization": "Bearer k-1"}, 120.0),
    ],
)
def test_each_adapters_client_sends_its_credentials_and_waits_its_time(
    settings, monkeypatch, name, key_env, headers, read_timeout
):
    settings.PROVIDERS = {
        **settings.PROVIDERS,
        name: {**settings.PROVIDERS[name], "base_url": "http://p.test/x"},
    }
    monkeypatch.setenv(key_env, "k-1")
    client = get_provider(name).client
    assert str(client.base_url) == "http://p.test/x/"
    assert {header: client.headers[header] for header in headers} == headers
    assert client.timeout == httpx.Timeout(read_timeout, connect=10.0)


def test_the_emulator_is_sent_a_stand_in_key_and_a_self_hosted_server_none(settings, monkeypatch):
    monkeypatch.delenv("BATCHDESK_EMULATOR_KEY", raising=False)
    monkeypatch.delenv("OPENAI_COMPATIBLE_API_KEY", raising=False)
    settings.PROVIDERS = {
        **settings.PROVIDERS,
        "openai_compatible": {**settings.PROVIDERS["openai_compatible"], "base_url": "http://p.test/v1"},
    }
    assert get_provider("emulator").client.headers["authorization"] == "Bearer emulator-key"
    assert "authorization" not in get_provider("openai_compatible").client.headers


def test_a_self_hosted_servers_connections_are_bounded_by_its_concurrency(settings):
    config = {**settings.PROVIDERS["openai_compatible"], "base_url": "http://p.test/v1", "concurrency": 3}
    settings.PROVIDERS = {**settings.PROVIDERS, "openai_compatible": config}
    pool = get_provider("openai_compatible").client._transport._pool
    assert (pool._max_connections, pool._max_keepalive_connections) == (3, 3)
