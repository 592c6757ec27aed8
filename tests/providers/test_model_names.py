"""A model name is checked per provider and never steers a request elsewhere (issue 17, point 4):
refused when a job is made (API, screen, command), and again by the adapters that put it in an
address, which send it as path segments of plain characters only."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from ledger.emulators.cloudflare import CloudflareEmulator
from ledger.emulators.gemini import GeminiEmulator
from ledger.models import Event, Job
from ledger.providers import get_provider
from ledger.providers.base import InferenceRequest, ProviderError
from ledger.providers.model_names import model_name_problem
from tests.api.conftest import ApiClient, assert_error, token_for
from tests.factories import ProductFactory, UserFactory

ESCAPE = "../../../../user/tokens/verify"
KEY = "secret-key-0123456789abcdef"

GOOD = [
    ("openai", "gpt-4o-mini"),
    ("openai", "ft:gpt-4o-mini-2024-07-18:acme::AbC123"),
    ("emulator", "gpt-4o-mini"),
    ("anthropic", "claude-haiku-4-5"),
    ("anthropic", "claude-sonnet-4-5-20250929"),
    ("openai_compatible", "meta-llama/Llama-3.1-8B-Instruct"),
    ("openai_compatible", "llama3.1:8b"),
    ("gemini", "gemini-2.5-flash"),
    ("gemini", "models/gemini-2.5-flash"),
    ("gemini", "tunedModels/my-model-4711"),
    ("cloudflare", "@cf/meta/llama-3.3-70b-instruct-fp8-fast"),
    ("cloudflare", "@cf/TinyLlama/tinyllama-1.1b-chat-v1.0"),
    ("cloudflare", "@hf/mistral/mistral-7b-instruct-v0.2"),
]

BAD = [
    ESCAPE,
    "..",
    "gpt..4",
    "gpt-4o?x=1",
    "gpt-4o#frag",
    "gpt-4o%2F..",
    "gpt 4o",
    "gpt-4o\n",
    "gpt-4o\x00",
    "gpt-4o\ud800",
    "/etc/passwd",
    "x" * 129,
]


@pytest.mark.parametrize(("provider", "model"), GOOD)
def test_real_model_names_are_accepted(provider, model):
    assert model_name_problem(provider, model) is None


@pytest.mark.parametrize(
    "provider", ["openai", "emulator", "anthropic", "openai_compatible", "gemini", "cloudflare"]
)
@pytest.mark.parametrize("model", BAD)
def test_names_that_could_leave_their_place_are_refused_by_every_provider(provider, model):
    assert model_name_problem(provider, model)


@pytest.mark.parametrize(
    ("provider", "model"),
    [
        ("openai", "meta-llama/Llama-3.1-8B-Instruct"),  # no slash where the provider's ids have none
        ("anthropic", "anthropic/claude-haiku-4-5"),
        ("gemini", "gemini-2.5-flash:streamGenerateContent"),  # another method of the model
        ("gemini", "models/gemini/2.5"),
        ("gemini", "files/abc"),
        ("cloudflare", "llama-3.3-70b"),
        ("cloudflare", "@cf/meta/llama/extra"),
        ("cloudflare", "@cf/meta"),
        ("cloudflare", "@xx/meta/llama"),
        ("cloudflare", "@cf/meta/llama|other"),  # the separator of Cloudflare's unit references
        ("openai_compatible", "/models/llama"),
    ],
)
def test_each_provider_takes_its_own_shape_of_name(provider, model):
    assert model_name_problem(provider, model)


# --- when a job is made ----------------------------------------------------------------------


@pytest.mark.django_db
def test_the_api_refuses_a_bad_model_with_a_field_error():
    ProductFactory(sku="OAK-1")
    client = ApiClient(token_for(UserFactory(roles=["catalogue_owner"])))
    body = {"reference": "r1", "task": "product_description", "provider": "emulator", "model": ESCAPE}
    error = assert_error(client.post_json("/api/jobs", body), 400, "invalid", {"model"})
    assert "not a model name for emulator" in error["fields"]["model"]
    assert not Job.objects.exists() and not Event.objects.exists()
    body["model"] = "gpt-4o-mini"
    assert client.post_json("/api/jobs", body).status_code == 202


@pytest.mark.django_db
def test_the_start_screen_refuses_a_bad_model_with_a_form_error():
    ProductFactory(sku="OAK-1")
    client = Client()
    client.force_login(UserFactory(roles=["catalogue_owner"]))
    form = {"reference": "r1", "task": "product_description", "provider": "emulator", "scope": "all"}
    response = client.post("/jobs/new", {**form, "model": ESCAPE})
    assert response.status_code == 400
    assert "model name" in " ".join(response.context["form"].errors["model"])
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_the_command_refuses_a_bad_model():
    ProductFactory(sku="OAK-1")
    UserFactory(is_superuser=True)
    options = {"reference": "r1", "task": "product_description", "provider": "cloudflare", "model": "../x"}
    with pytest.raises(CommandError, match="not a model name for cloudflare"):
        call_command("create_job", **options)
    assert not Job.objects.exists()


# --- where the name becomes an address ------------------------------------------------------


class RecordingServer:
    """An HTTP server that notes the path of every request it gets, and answers 404 to each."""

    def __init__(self):
        recorder = self
        self.paths: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def answer(self):
                recorder.paths.append(self.path)
                self.rfile.read(int(self.headers.get("content-length") or 0))
                body = json.dumps({"error": {"code": 404, "message": "nothing here"}}).encode()
                self.send_response(404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "RecordingServer":
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.server.shutdown()
        self.server.server_close()


def unit(model: str) -> list[InferenceRequest]:
    return [
        InferenceRequest(
            custom_id="bd-1-1",
            model=model,
            system_message="You write product descriptions.",
            user_message="Write a description.\nTitle: Beech spoon\nFacts:\n- material: beech",
            output_schema=None,
            max_output_tokens=100,
        )
    ]


def adapter(name: str, base_url: str, settings, monkeypatch):
    settings.PROVIDERS = {**settings.PROVIDERS, name: {**settings.PROVIDERS[name], "base_url": base_url}}
    monkeypatch.setenv(settings.PROVIDERS[name]["api_key_env"], KEY)
    monkeypatch.setenv("CLOUDFLARE_ACCOUNT_ID", "acct0123")
    return get_provider(name)


@pytest.mark.parametrize(("name", "base_path"), [("gemini", "/v1beta"), ("cloudflare", "/client/v4")])
@pytest.mark.parametrize("model", [ESCAPE, "models/" + ESCAPE, "@cf/" + ESCAPE, "@cf/a/b?x=1", "@cf/a/b#c"])
def test_an_adapter_refuses_a_name_that_would_leave_its_path_and_sends_nothing(
    name, base_path, model, settings, monkeypatch
):
    with RecordingServer() as server:
        provider = adapter(name, server.url + base_path, settings, monkeypatch)
        with pytest.raises(ProviderError) as refused:
            provider.submit(requests=unit(model), intent_key="bd_k", metadata={})
        provider.client.close()
    assert server.paths == []
    assert refused.value.status == 400 and not refused.value.transient


@pytest.mark.parametrize(
    ("name", "emulator", "model"),
    [
        ("gemini", GeminiEmulator, "gemini-2.5-flash"),
        ("gemini", GeminiEmulator, "models/gemini-2.5-flash"),
        ("cloudflare", CloudflareEmulator, "@cf/meta/llama-3.3-70b-instruct-fp8-fast"),
    ],
)
def test_a_good_name_still_reaches_the_emulator(name, emulator, model, settings, monkeypatch):
    with emulator(per_request_ms=1) as running:
        provider = adapter(name, running.base_url, settings, monkeypatch)
        assert provider.submit(requests=unit(model), intent_key="bd_k", metadata={})
        provider.client.close()
