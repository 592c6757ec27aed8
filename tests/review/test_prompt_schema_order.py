"""The prompt screens show an output schema in its author's order (SPEC rule 19): the version itself,
what each provider is sent, the exact request of each provider, and a new version that only
reorders the properties, which changes what a model writes first."""

import json

import pytest
from django.urls import reverse

from ledger.actions.prompts import create_prompt_version, make_prompt_current
from ledger.bootstrap import DEFAULT_PROMPT
from ledger.models import PromptVersion
from ledger.providers import provider_names
from tests.factories import ProductFactory
from tests.review.test_prompt_dialects_screen import schema_in
from tests.review.test_prompt_screens import new_url, new_version

pytestmark = pytest.mark.django_db

AUTHORED = {
    "type": "object",
    "properties": {
        "headline": {"type": "string", "maxLength": 120},
        "description": {"type": "string", "minLength": 40},
        "tone": {"enum": ["warm", "plain"]},
    },
    "required": ["headline", "description"],
}
ORDER = ["headline", "description", "tone"]


@pytest.fixture
def authored() -> PromptVersion:
    return create_prompt_version(
        task="ordered",
        system_message=DEFAULT_PROMPT["system_message"],
        template=DEFAULT_PROMPT["template"],
        output_schema=AUTHORED,
        rules={},
        max_output_tokens=600,
    )


def in_order(text: str) -> bool:
    """Whether the property names appear in `text`'s first `properties` in the author's order."""
    text = text[text.find('"properties"') :]
    places = [text.find(f'"{name}"') for name in ORDER]
    return -1 not in places and places == sorted(places)


def test_the_version_and_what_each_provider_is_sent_read_in_the_authors_order(client, operator, authored):
    client.force_login(operator)

    response = client.get(reverse("prompt_detail", args=[authored.pk]))

    assert in_order(response.context["schema_json"])
    for dialect in response.context["schemas_as_sent"]:
        assert list(json.loads(dialect.schema_json)["properties"]) == ORDER, dialect.label
    html = response.content.decode().replace("&quot;", '"')
    shown = html.split('data-testid="output-schema">')[1].split("</pre>")[0]
    assert in_order(shown)
    sent = html.split('data-testid="schema-as-sent">')[1:]
    assert len(sent) == 3 and all(in_order(block.split("</pre>")[0]) for block in sent)


@pytest.mark.parametrize("provider", provider_names())
def test_the_exact_request_of_every_provider_carries_the_authors_order(client, operator, authored, provider):
    ProductFactory(sku="OAK-1", revision__title="Oak board")
    client.force_login(operator)

    response = client.get(
        reverse("prompt_detail", args=[authored.pk]), {"sku": "OAK-1", "provider": provider}
    )

    request = json.loads(response.context["preview"].request_json)
    assert list(schema_in(provider, request)["properties"]) == ORDER
    shown = response.content.decode().replace("&quot;", '"').split('data-testid="preview-request"')[1]
    assert in_order(shown.split("</pre>")[0])


def test_a_version_that_only_reorders_the_properties_is_a_new_version_and_its_diff_says_so(
    client, owner, authored
):
    make_prompt_current(prompt=authored, actor=owner)
    client.force_login(owner)
    reordered = {**AUTHORED, "properties": {name: AUTHORED["properties"][name] for name in reversed(ORDER)}}

    response = client.post(new_url(authored), new_version(authored, output_schema=json.dumps(reordered)))

    assert response.status_code == 302
    v2 = PromptVersion.objects.get(task="ordered", version=2)
    assert list(v2.output_schema["properties"]) == ["tone", "description", "headline"]
    from_current = client.get(reverse("prompt_detail", args=[v2.pk])).context["diff"]
    assert [part.name for part in from_current] == ["Output schema"]
    # The new form for v2 starts from its own order.
    form = client.get(new_url(v2)).context["form"]
    assert list(json.loads(form["output_schema"].value())["properties"]) == [
        "tone",
        "description",
        "headline",
    ]
