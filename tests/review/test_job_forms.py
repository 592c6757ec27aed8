"""Job creation is checked by one form (`review.job_forms.JobForm`) behind both doors: the start
screen and `POST /api/jobs` refuse the same things with the same words, and the limits live once."""

import dataclasses
import json

import pytest
from django.test import Client
from django.urls import reverse

from ledger import providers
from ledger.actions.jobs import create_job
from ledger.models import Job
from ledger.providers.openai import OpenAIBatchProvider
from review.job_forms import ApiJobForm, JobForm
from review.screen_forms import JobStartForm
from tests.api.conftest import token_for
from tests.factories import ProductFactory, UserFactory
from tests.review.test_jobs_screens import start

pytestmark = pytest.mark.django_db


def test_both_doors_use_the_one_form():
    assert issubclass(JobStartForm, JobForm) and issubclass(ApiJobForm, JobForm)


@pytest.mark.parametrize(
    "field, value",
    [
        ("unit_size", 50_001),
        ("unit_size", 0),
        ("provider", "nobody"),
        ("destination", "nowhere"),
        ("model", "m" * 129),
    ],
)
def test_the_screen_and_the_api_refuse_alike(client, field, value):
    ProductFactory()
    owner = UserFactory(roles=["catalogue_owner"])
    client.force_login(owner)
    screen = client.post(reverse("job_start"), start(step="start", reference="same", **{field: str(value)}))
    assert screen.status_code == 400
    screen_errors = screen.context["form"].errors[field]

    api = Client(headers={"Authorization": f"Bearer {token_for(owner)}"})
    body = {"reference": "same", "task": "product_description", "provider": "emulator", field: value}
    response = api.post("/api/jobs", json.dumps(body), content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"][field] == " ".join(screen_errors)
    assert not Job.objects.exists()


# --- providers: only those configured here, units within their limits --------------------------


def both_doors(client, **changes) -> tuple[list[str], dict, object]:
    """The start screen's answer to estimating a job and the API's to starting it: (screen errors,
    API error fields, API response)."""
    ProductFactory()
    owner = UserFactory(roles=["catalogue_owner"])
    client.force_login(owner)
    changes = {"reference": "same", **changes}
    screen = client.post(reverse("job_start"), start(step="estimate", **changes))
    api = Client(headers={"Authorization": f"Bearer {token_for(owner)}"})
    body = {"task": "product_description", "provider": "emulator", **changes}
    body = {key: int(value) if key == "unit_size" else value for key, value in body.items()}
    response = api.post("/api/jobs", json.dumps(body), content_type="application/json")
    fields = response.json().get("error", {}).get("fields", {})
    return screen.context["form"].errors if screen.status_code == 400 else {}, fields, response


def test_only_configured_providers_are_offered(client, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("GEMINI_API_KEY", "test-key")
    offered = [name for name, _ in JobForm().fields["provider"].choices]
    assert "gemini" in offered and "emulator" in offered
    assert "openai" not in offered and "anthropic" not in offered
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    assert "openai" in [name for name, _ in JobForm().fields["provider"].choices]


@pytest.mark.parametrize(
    "provider, needs",
    [
        ("openai", "set OPENAI_API_KEY."),
        ("cloudflare", "set CLOUDFLARE_API_TOKEN and CLOUDFLARE_ACCOUNT_ID."),
    ],
)
def test_a_provider_not_configured_is_refused_naming_what_it_needs(client, monkeypatch, provider, needs):
    for variable in ("OPENAI_API_KEY", "CLOUDFLARE_API_TOKEN", "CLOUDFLARE_ACCOUNT_ID"):
        monkeypatch.delenv(variable, raising=False)
    screen, api, response = both_doors(client, provider=provider)
    message = f"The provider {provider} is not configured here: {needs}"
    assert screen["provider"] == [message]
    assert response.status_code == 400 and api["provider"] == message
    assert not Job.objects.exists()


def test_a_configured_provider_starts_a_job(client, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    screen, api, response = both_doors(client, provider="openai")
    assert response.status_code == 202, response.content
    assert Job.objects.get().provider == "openai"


def test_the_unit_size_is_capped_by_the_providers_limit(client, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    limited = dataclasses.replace(OpenAIBatchProvider.capabilities, max_requests=100)
    monkeypatch.setattr(OpenAIBatchProvider, "capabilities", limited)
    screen, api, response = both_doors(client, provider="openai", unit_size="101")
    message = "At most 100 requests: openai's limit for one batch."
    assert screen["unit_size"] == [message] and api["unit_size"] == message
    assert not Job.objects.exists()
    assert "openai 100" in JobForm().fields["unit_size"].help_text
    _, _, response = both_doors(client, provider="openai", unit_size="100", reference="other")
    assert response.status_code == 202, response.content


def test_a_unit_may_be_as_large_as_its_provider_takes_and_no_larger(client, monkeypatch):
    """Anthropic takes 100,000 requests in a batch, OpenAI 50,000: neither is the other's limit."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    screen, api, response = both_doors(client, provider="anthropic", unit_size="100000")
    assert response.status_code == 202, response.content
    assert Job.objects.get().unit_size == 100_000
    assert screen == {}
    screen, api, response = both_doors(client, provider="anthropic", unit_size="100001", reference="more")
    message = "At most 100,000 requests: anthropic's limit for one batch."
    assert screen["unit_size"] == [message] and api["unit_size"] == message
    screen, api, response = both_doors(client, provider="openai", unit_size="50001", reference="openai")
    message = "At most 50,000 requests: openai's limit for one batch."
    assert screen["unit_size"] == [message] and api["unit_size"] == message
    assert Job.objects.count() == 1
    # The browser lets through the largest unit a configured provider takes; the form does the rest.
    assert JobForm().fields["unit_size"].widget.attrs["max"] == 100_000
    owner = UserFactory(roles=["catalogue_owner"])
    job = create_job(
        reference="by-verb", owner=owner, task="product_description", provider="anthropic", unit_size=100_000
    )
    assert job.unit_size == 100_000


def test_a_provider_whose_adapter_is_missing_is_refused_clearly(client, monkeypatch):
    monkeypatch.setitem(providers.ADAPTERS, "openai", "ledger.providers.not_written_yet.Adapter")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    screen, api, response = both_doors(client, provider="openai")
    message = "BatchDesk has no adapter for openai in this version yet."
    assert screen["provider"] == [message] and api["provider"] == message
    assert "openai" not in JobForm().fields["unit_size"].help_text  # the page still renders
