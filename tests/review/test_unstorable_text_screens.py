"""A NUL or a lone surrogate sent to a screen is refused, never a 500 (issue 17, point 4). A form's
text arrives decoded by Django, which turns bytes that are no UTF-8 (a surrogate's `%ED%A0%80`)
into U+FFFD, so a lone surrogate can only come inside JSON a person types (`"\\ud800"`); a NUL can
come either way."""

import pytest
from django.test import Client

from ledger.models import Approval, Event, Item, Job, PromptVersion
from tests.factories import ItemFactory, ProductFactory, UserFactory, add_version

pytestmark = pytest.mark.django_db

SCHEMA = (
    '{"type": "object", "properties": {"description": {"type": "string", "description": "SPOIL"}}, '
    '"required": ["description"]}'
)


@pytest.fixture
def person() -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(UserFactory(roles=["admin"]))
    return client


@pytest.fixture
def draft():
    return add_version(ItemFactory(awaiting_review=True, product=ProductFactory(sku="OAK-1")))


def ledger_as_it_is() -> tuple:
    return (
        sorted(Job.objects.values_list("reference", flat=True)),
        sorted(Item.objects.values_list("id", "state")),
        Event.objects.count(),
        Approval.objects.count(),
        PromptVersion.objects.count(),
    )


def screen_posts(draft, spoiler: str) -> list[tuple[str, dict]]:
    text = f"fine{spoiler}text"
    return [
        (
            "/jobs/new",
            {"reference": text, "task": "product_description", "provider": "emulator", "scope": "all"},
        ),
        (
            f"/items/{draft.item_id}/approve",
            {"version": draft.pk, "content_hash": draft.content_hash, "content": text},
        ),
        (f"/items/{draft.item_id}/reject", {"version": draft.pk, "reason": text}),
        (
            "/prompts/new",
            {
                "task": "product_description",
                "system_message": "Write.",
                "template": "{title} {facts}",
                "output_schema": SCHEMA.replace("SPOIL", text),
                "max_output_tokens": "100",
            },
        ),
    ]


@pytest.mark.parametrize("spoiler", ["\x00", "\\u0000", "\\ud800"], ids=["NUL", "JSON NUL", "JSON surrogate"])
def test_a_screen_form_refuses_what_cannot_be_stored(person, draft, spoiler):
    before = ledger_as_it_is()
    for path, form in screen_posts(draft, spoiler):
        response = person.post(path, form)
        # A JSON escape is text to every field but the prompt's schema: stored as typed, or refused.
        assert response.status_code < 500, (path, response.status_code)
        if spoiler == "\x00" or path == "/prompts/new":
            assert response.status_code == 400, (path, response.status_code)
    if spoiler == "\x00":
        assert ledger_as_it_is() == before


@pytest.mark.parametrize("sku", ["OAK%001", "OAK\x001"])
def test_a_product_address_with_a_nul_is_not_found(person, draft, sku):
    assert person.get(f"/catalogue/{sku}/").status_code == 404
