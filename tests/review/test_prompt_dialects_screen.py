"""The prompt version's page shows, per provider, what it is sent of the output schema and what is
left to the ledger; its exact-request preview shows any provider's request (SPEC rule 17)."""

import json

import pytest
from django.urls import reverse

from ledger.drafts.schema_dialects import sent_schema
from ledger.models import PromptVersion
from ledger.providers import provider_names
from tests.factories import ProductFactory
from tests.review.browser import log_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def v1() -> PromptVersion:
    return PromptVersion.objects.get(task="product_description", version=1)


def shown_dialects(response) -> dict[str, tuple[list[str], dict, list[str]]]:
    """label: (providers, schema as sent, what is left to the ledger, as shown)."""
    return {
        dialect.label: (
            dialect.providers,
            json.loads(dialect.schema_json),
            [str(x) for x in dialect.left_to_ledger],
        )
        for dialect in response.context["schemas_as_sent"]
    }


def test_the_page_shows_what_each_provider_is_sent_and_what_the_ledger_checks_alone(client, operator, v1):
    client.force_login(operator)
    response = client.get(reverse("prompt_detail", args=[v1.pk]))

    lengths = [
        f"{key} at /properties/{name}"
        for name in ("headline", "description")
        for key in ("minLength", "maxLength")
    ]
    shown = shown_dialects(response)
    assert shown["OpenAI's strict Structured Outputs"][0] == ["emulator", "openai", "openai_compatible"]
    assert (
        shown["OpenAI's strict Structured Outputs"][1]
        == sent_schema(v1.output_schema, "openai_strict").schema
    )
    assert sorted(shown["OpenAI's strict Structured Outputs"][2]) == sorted(lengths)
    assert shown["Gemini's responseJsonSchema subset"][0] == ["gemini"]
    assert sorted(shown["Gemini's responseJsonSchema subset"][2]) == sorted(lengths)
    assert shown["The schema as it is"] == (["anthropic", "cloudflare"], v1.output_schema, [])
    html = response.content.decode()
    assert "<code>maxLength</code> at <code>/properties/headline</code>" in html
    assert "Sent whole: nothing is left to the ledger alone." in html


def test_a_server_sent_the_schema_as_it_is_is_shown_with_anthropic_and_cloudflare(
    client, operator, v1, settings
):
    settings.PROVIDERS = {
        **settings.PROVIDERS,
        "openai_compatible": {**settings.PROVIDERS["openai_compatible"], "schema_dialect": "as_is"},
    }
    client.force_login(operator)
    response = client.get(reverse("prompt_detail", args=[v1.pk]))

    shown = shown_dialects(response)
    assert shown["The schema as it is"][0] == ["anthropic", "cloudflare", "openai_compatible"]
    assert shown["OpenAI's strict Structured Outputs"][0] == ["emulator", "openai"]


def schema_in(provider: str, request: dict) -> dict:
    """Where each provider's request carries the output schema."""
    if provider in ("openai", "emulator"):
        return request["body"]["response_format"]["json_schema"]["schema"]
    if provider == "openai_compatible":
        return request["response_format"]["json_schema"]["schema"]
    if provider == "anthropic":
        return request["params"]["tools"][0]["input_schema"]
    if provider == "gemini":
        return request["request"]["generationConfig"]["responseJsonSchema"]
    return request["response_format"]["json_schema"]


@pytest.mark.parametrize("provider", provider_names())
def test_the_preview_shows_the_request_each_provider_is_sent(client, operator, v1, provider, settings):
    ProductFactory(sku="OAK-1", revision__title="Oak board", revision__fields={"material": "oak"})
    client.force_login(operator)

    response = client.get(reverse("prompt_detail", args=[v1.pk]), {"sku": "OAK-1", "provider": provider})

    assert response.status_code == 200
    request = json.loads(response.context["preview"].request_json)
    dialect = {"anthropic": "as_is", "cloudflare": "as_is", "gemini": "gemini"}.get(provider, "openai_strict")
    assert schema_in(provider, request) == sent_schema(v1.output_schema, dialect).schema
    if provider not in ("gemini", "cloudflare"):  # these two name the model in the address
        body = request.get("body") or request.get("params") or request
        assert body["model"] == settings.PROVIDERS[provider]["default_model"]
    assert "Title: Oak board" in json.dumps(request)
    assert f"as the <code>{provider}</code> adapter sends it" in response.content.decode()


def test_a_model_name_the_provider_would_refuse_is_a_form_error(client, operator, v1):
    ProductFactory(sku="OAK-1")
    client.force_login(operator)

    response = client.get(
        reverse("prompt_detail", args=[v1.pk]), {"sku": "OAK-1", "provider": "gemini", "model": "../../x"}
    )

    assert response.status_code == 200 and response.context["preview"] is None
    assert "is not a model name for gemini" in response.content.decode()


def test_an_unknown_provider_is_a_form_error(client, operator, v1):
    ProductFactory(sku="OAK-1")
    client.force_login(operator)

    response = client.get(reverse("prompt_detail", args=[v1.pk]), {"sku": "OAK-1", "provider": "mistral"})

    assert response.status_code == 200 and response.context["preview"] is None
    assert "Select a valid choice" in response.content.decode()


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_page_reads_at_390_pixels_with_schemas_scrolling_inside_themselves(page, live_server, operator):
    v1 = PromptVersion.objects.get(task="product_description", version=1)
    ProductFactory(sku="OAK-1", revision__title="Oak board " * 30)
    page.set_viewport_size({"width": 390, "height": 800})
    url = reverse("prompt_detail", args=[v1.pk]) + "?sku=OAK-1&provider=gemini"
    log_in(page, live_server, operator, then=url)

    assert page.get_by_test_id("schema-as-sent").count() == 3
    assert page.get_by_test_id("preview-request").is_visible()
    # Nothing is wider than the screen: long schemas and requests wrap or scroll inside their box.
    wide = page.evaluate(
        "[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > 391)"
        ".map(e => e.tagName + '.' + e.className + '#' + (e.dataset.testid || ''))"
    )
    assert wide == []
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    for box in page.locator("pre.json").all():
        assert box.evaluate("e => e.getBoundingClientRect().right") <= 390
        assert box.evaluate("e => getComputedStyle(e).overflow") == "auto"
