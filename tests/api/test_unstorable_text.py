"""A NUL or a lone surrogate anywhere in an API body is bad input (issue 17, point 4): 400 in the
error shape of SPEC §6, naming the field, and nothing changes. PostgreSQL stores neither; JSON lets
a client write both (`"\\u0000"`, `"\\ud800"`)."""

import json

import pytest

from ledger.models import Approval, Event, GeneratedVersion, Item, Job, Product, SourceRevision
from review.api import urls as api_urls
from tests.api.conftest import assert_error
from tests.factories import ItemFactory, ProductFactory, add_version

pytestmark = pytest.mark.django_db

SPOILERS = {"NUL": ("\x00", "contains a NUL character"), "surrogate": ("\ud800", "unpaired surrogate")}
# The API's addresses that take no body: reading only.
READ_ONLY = {
    "job",
    "job_items",
    "job_submissions",
    "item",
    "health",
    "pilot_report",
    "job_stream",
    "job_notifications",
    "job_export",
    "job_charges",
    "job_costs",
}


@pytest.fixture
def world():
    product = ProductFactory(sku="OAK-1")
    draft = add_version(ItemFactory(awaiting_review=True, product=product))
    failed = ItemFactory(state="inference_failed", job=draft.item.job)
    return {"sku": product.sku, "job": draft.item.job_id, "draft": draft, "failed": failed.pk}


def endpoints(world) -> list[tuple[str, str, str, dict]]:
    """(name, method, path, a body each endpoint accepts): every endpoint that reads a body."""
    draft, sku = world["draft"], world["sku"]
    version = f"/api/items/{draft.item_id}/versions/{draft.pk}"
    return [
        (
            "jobs",
            "post",
            "/api/jobs",
            {
                "reference": "spring-range",
                "task": "product_description",
                "provider": "emulator",
                "model": "gpt-4o-mini",
                "destination": "catalogue",
                "skus": [sku],
            },
        ),
        ("cancel_job", "post", f"/api/jobs/{world['job']}/cancel", {}),
        ("approve", "post", f"{version}/approve", {"content": draft.content, "note": "fine"}),
        ("reject", "post", f"{version}/reject", {"reason": "too vague"}),
        ("retry", "post", f"/api/items/{world['failed']}/retry", {"unit": "inference"}),
        ("comments", "post", f"/api/items/{draft.item_id}/comments", {"text": "Check the size"}),
        (
            "product",
            "put",
            f"/api/products/{sku}",
            {"title": "Oak board", "colour": "red", "dimensions": {"unit": "cm", "sides": ["40", "25"]}},
        ),
        ("withdraw", "post", f"/api/products/{sku}/withdraw", {}),
        ("prompt_current", "post", "/api/prompts/product_description/current", {"version": 1}),
        # Last, past the first 7 the test below sends unspoilt: these two are accepted only for a
        # job that can be held to a budget, or is paused (tests/api/test_budget.py).
        ("job_budget", "post", f"/api/jobs/{world['job']}/budget", {"budget": "12.50"}),
        ("resume_job", "post", f"/api/jobs/{world['job']}/resume", {}),
        # Accepted only after a decision of the caller's own (tests/api/test_team_review.py).
        ("undo", "post", f"/api/items/{draft.item_id}/undo", {}),
        # Accepted only for a pilot whose report can project (tests/api/test_pilot_decision.py).
        (
            "pilot_decision",
            "post",
            f"/api/jobs/{world['job']}/pilot/decision",
            {"decision": "go", "note": "worth it", "budget": "12.50"},
        ),
    ]


def spoiled(body: dict, spoiler: str) -> list[tuple[str, dict]]:
    """(the field named in the error, the body) for each text in `body`, and each key, spoilt in turn;
    and a key of its own holding the spoiler, named `body`."""

    def variants(value):
        if isinstance(value, str):
            yield value[:1] + spoiler + value[1:]
        elif isinstance(value, list):
            for index, element in enumerate(value):
                for variant in variants(element):
                    yield value[:index] + [variant] + value[index + 1 :]
        elif isinstance(value, dict):
            for key, element in value.items():
                for variant in variants(element):
                    yield {**value, key: variant}
                yield {(k + spoiler if k == key else k): v for k, v in value.items()}

    found = []
    for name, value in body.items():
        found += [(name, {**body, name: variant}) for variant in variants(value)]
    found.append(("body", {**body, "x" + spoiler: 1}))
    return found


def ledger_as_it_is() -> dict:
    return {
        "jobs": sorted(Job.objects.values_list("reference", "state")),
        "items": sorted(Item.objects.values_list("id", "state", "reason")),
        "events": Event.objects.count(),
        "versions": GeneratedVersion.objects.count(),
        "approvals": Approval.objects.count(),
        "products": sorted(Product.objects.values_list("sku", "status", "current_revision")),
        "revisions": SourceRevision.objects.count(),
    }


def test_every_endpoint_that_reads_a_body_is_walked(world):
    named = {pattern.name for pattern in api_urls.urlpatterns if pattern.name}
    assert {name for name, *_ in endpoints(world)} == named - READ_ONLY


@pytest.mark.parametrize("spoiler", SPOILERS)
def test_a_nul_or_a_lone_surrogate_in_any_field_is_a_400_and_changes_nothing(
    api_as, admin_person, world, spoiler
):
    client = api_as(admin_person)
    character, words = SPOILERS[spoiler]
    before = ledger_as_it_is()
    tried = 0
    for name, method, path, body in endpoints(world):
        for field, bad_body in spoiled(body, character):
            # As a client writes it: the character as a JSON escape.
            raw = json.dumps(bad_body)
            response = getattr(client, f"{method}_json")(path, raw)
            error = assert_error(response, 400, "invalid", {field})
            assert words in error["fields"][field], (name, field, error)
            tried += 1
    assert ledger_as_it_is() == before
    assert tried >= 20


@pytest.mark.parametrize("index", range(7))
def test_the_same_bodies_unspoilt_are_accepted(api_as, admin_person, world, index):
    """The walk above is of bodies the API takes: each one, as it is, is accepted."""
    name, method, path, body = endpoints(world)[index]
    response = getattr(api_as(admin_person), f"{method}_json")(path, body)
    assert response.status_code < 300, (name, response.content)
