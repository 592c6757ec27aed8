"""`GET /api/jobs/{id}/costs?by=FIELD` (SPEC §6): a job's cost by a product field or the item's state,
the groups adding up to the job's cost exactly, and the field checked."""

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.actions.reviewing import approve_version, reject_version
from ledger.models import GeneratedVersion, Item
from ledger.money.pricing import job_cost
from ledger.states import ItemState
from tests.api.conftest import ApiClient, assert_error
from tests.factories import ItemFactory, JobFactory, ProductFactory, add_version

pytestmark = pytest.mark.django_db


def made(job, category: str | None = None, *, state=ItemState.AWAITING_REVIEW) -> Item:
    fields = {"material": "oak"} if category is None else {"material": "oak", "category": category}
    return ItemFactory(job=job, product=ProductFactory(revision__fields=fields), state=state)


def drafted(item: Item, input_tokens: int, output_tokens: int) -> GeneratedVersion:
    version = add_version(item)
    GeneratedVersion.objects.filter(pk=version.pk).update(
        input_tokens=input_tokens, output_tokens=output_tokens
    )
    version.refresh_from_db()
    return version


def approve(item: Item, version: GeneratedVersion, by) -> None:
    approve_version(item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=by)


@pytest.fixture
def job(pounds, owner):
    """A job in pounds (gpt-4o-mini, today's rate 0.7890) whose tokens make amounts that do not divide
    evenly: furniture, two items, one approved after a redraft, one rejected; kitchen, one approved and
    one waiting for review; one product without a category, waiting; one never drafted."""
    job = JobFactory(owner=owner, model="gpt-4o-mini")
    sofa, chair = made(job, "furniture"), made(job, "furniture")
    drafted(sofa, 1_111, 3_333)  # replaced by the next draft: wasted
    approve(sofa, drafted(sofa, 1_234, 5_678), owner)
    reject_version(
        item_id=chair.pk, version_id=drafted(chair, 2_222, 7_777).pk, reviewer=owner, reason="Wrong"
    )
    board, spoon = made(job, "kitchen"), made(job, "kitchen")
    approve(board, drafted(board, 333, 111), owner)
    drafted(spoon, 444, 222)  # pending
    drafted(made(job), 555, 999)  # pending, no category
    made(job, "kitchen", state=ItemState.PREPARED)
    return job


def costs(client: ApiClient, job, by: str = "category", **query):
    response = client.get(f"/api/jobs/{job.pk}/costs", {"by": by, **query})
    assert response.status_code == 200, response.content
    return response.json()


def test_the_groups_add_up_to_the_jobs_cost_exactly(as_owner, job):
    body = costs(as_owner, job)
    whole = job_cost(job)
    assert body["currency"] == "GBP" == whole["currency"]
    results = {row["key"]: row for row in body["results"]}
    assert list(results) == ["furniture", None, "kitchen"]  # the dearest first
    assert sum(Decimal(row["amount"]) for row in body["results"]) == whole["total"]
    assert sum(Decimal(row["wasted"]) for row in body["results"]) == whole["wasted"]
    usd = whole["provider_currency"]
    assert sum(Decimal(row["provider_currency"]["amount"]) for row in body["results"]) == usd["total"]
    assert Decimal(body["total"]) == whole["total"]

    furniture, kitchen, none = results["furniture"], results["kitchen"], results[None]
    assert (furniture["items"], furniture["approved"]) == (2, 1)
    assert (kitchen["items"], kitchen["approved"]) == (3, 1)
    assert (none["items"], none["approved"], none["label"]) == (1, 0, "(none)")

    # Each group's share: its drafts at the job's price, (in × 0.15 + out × 0.60) / 2 per million.
    def usd_of(*drafts) -> Decimal:
        return sum(Decimal(i) * Decimal("0.075") + Decimal(o) * Decimal("0.30") for i, o in drafts) / 10**6

    furniture_usd = usd_of((1_111, 3_333), (1_234, 5_678), (2_222, 7_777))
    assert Decimal(furniture["provider_currency"]["amount"]) == pytest.approx(
        furniture_usd, abs=Decimal("2e-6")
    )
    assert Decimal(furniture["amount"]) == pytest.approx(
        furniture_usd * Decimal("0.7890"), abs=Decimal("2e-6")
    )
    # Wasted: the replaced draft and the rejected one; the kitchen's drafts are approved or pending.
    assert Decimal(furniture["provider_currency"]["wasted"]) == pytest.approx(
        usd_of((1_111, 3_333), (2_222, 7_777)), abs=Decimal("2e-6")
    )
    assert Decimal(kitchen["wasted"]) == Decimal(none["wasted"]) == 0
    # The whole spend over the drafts approved, as exact text.
    assert furniture["per_approved"] == furniture["amount"]
    assert none["per_approved"] is None
    assert isinstance(furniture["amount"], str)


def test_by_state(as_operator, job):
    body = costs(as_operator, job, "state")
    results = {row["key"]: row for row in body["results"]}
    assert {key: row["items"] for key, row in results.items()} == {
        "approved": 2,
        "rejected": 1,
        "awaiting_review": 2,
        "prepared": 1,
    }
    assert Decimal(results["prepared"]["amount"]) == 0
    assert results["approved"]["approved"] == 2
    # Its spend over its two approved drafts, exactly as the ledger divides (`pricing._divide`).
    approved_amount = Decimal(results["approved"]["amount"])
    assert approved_amount > 0
    assert Decimal(results["approved"]["per_approved"]) == (approved_amount / 2).quantize(Decimal("0.000001"))
    assert sum(Decimal(row["amount"]) for row in body["results"]) == job_cost(job)["total"]


def test_a_worked_job_settled_at_its_units_rate_adds_up_too(as_owner, worked_job):
    job, _ = worked_job
    whole = job_cost(job)
    assert whole["rate"]["source"] == "Bank of England daily spot, 4 pm"
    for by in ("state", "material", "title"):
        results = costs(as_owner, job, by)["results"]
        assert sum(Decimal(row["amount"]) for row in results) == whole["total"]
        assert sum(Decimal(row["wasted"]) for row in results) == whole["wasted"]
        assert sum(row["items"] for row in results) == 6


def test_by_title_and_by_a_field_no_product_has(as_owner, job):
    by_title = costs(as_owner, job, "title")
    assert len(by_title["results"]) == 6
    nobody = costs(as_owner, job, "colour")
    [everything] = nobody["results"]
    assert (everything["key"], everything["items"]) == (None, 6)
    assert Decimal(everything["amount"]) == job_cost(job)["total"]


@pytest.mark.postgresql_only  # SQLite's JSON text of a list or a null differs (the demo's database)
def test_field_values_of_any_json_type_are_grouped_as_text(as_owner, pounds, owner):
    job = JobFactory(owner=owner)
    for size in (3, 3, "3", [1, 2], None):
        item = ItemFactory(job=job, product=ProductFactory(revision__fields={"size": size}))
        drafted(item, 100, 100)
    results = {row["key"]: row["items"] for row in costs(as_owner, job, "size")["results"]}
    assert results == {"3": 3, "[1, 2]": 1, None: 1}


def test_the_groups_take_one_query_however_many_items(as_owner, job):
    costs(as_owner, job)  # the token's first use is written once
    with CaptureQueriesContext(connection) as few:
        costs(as_owner, job)
    for _ in range(5):
        drafted(made(job, "garden"), 10, 10)
    with CaptureQueriesContext(connection) as more:
        costs(as_owner, job)
    assert len(more) == len(few)
    grouped = [q["sql"] for q in more if "GROUP BY" in q["sql"] and 'FROM "ledger_item"' in q["sql"]]
    assert len(grouped) == 1


def test_a_field_name_in_any_alphabet(as_owner, pounds, owner):
    job = JobFactory(owner=owner)
    drafted(ItemFactory(job=job, product=ProductFactory(revision__fields={"catégorie": "cuisine"})), 10, 10)
    assert [row["key"] for row in costs(as_owner, job, "catégorie")["results"]] == ["cuisine"]


@pytest.mark.parametrize("name", ["0", "7", "999999999999999999999999999999", "-1"])
def test_a_field_named_with_digits_is_a_field_never_an_index(as_owner, pounds, owner, name):
    """A name of digits is a key of the product's fields, not an index into a list, and never a 500."""
    job = JobFactory(owner=owner)
    for fields in ({name: "kitchen"}, {name: "kitchen"}, {"other": "garden"}):
        drafted(ItemFactory(job=job, product=ProductFactory(revision__fields=fields)), 10, 10)
    body = costs(as_owner, job, name)
    assert body["by"] == name
    assert {row["key"]: row["items"] for row in body["results"]} == {"kitchen": 2, None: 1}


def test_a_field_named_with_digits_of_a_job_without_it(as_owner, job):
    [everything] = costs(as_owner, job, "999999999999999999999999999999")["results"]
    assert (everything["key"], everything["items"]) == (None, 6)


def test_a_model_without_a_price_has_null_amounts(as_owner, owner):
    job = JobFactory(owner=owner, model="no-such-model")
    drafted(made(job, "kitchen"), 100, 100)
    body = costs(as_owner, job)
    [row] = body["results"]
    assert (row["items"], row["amount"], row["wasted"], row["per_approved"]) == (1, None, None, None)
    assert "price unknown" in body["price_note"]


@pytest.mark.parametrize(
    "query, problem",
    [
        ({}, "missing"),
        ({"by": ""}, "missing"),
        ({"by": "a b"}, "not a field name"),
        ({"by": "fields.category"}, "not a field name"),
        ({"by": "x" * 65}, "not a field name"),
        ({"by": "category'--"}, "not a field name"),
        ({"by": 'cat"egory'}, "not a field name"),
        ({"by": "cat\\egory"}, "not a field name"),
        ({"by": "$.category"}, "not a field name"),
        ({"by": "0.1"}, "not a field name"),
    ],
)
def test_a_bad_or_missing_field_is_a_400(as_owner, job, query, problem):
    error = assert_error(as_owner.get(f"/api/jobs/{job.pk}/costs", query), 400, "invalid", {"by"})
    assert problem in error["fields"]["by"]
    assert "letters, digits, _ and -" in error["fields"]["by"]


def test_a_field_with_a_value_per_product_beyond_the_limit_is_a_400(as_owner, job, monkeypatch):
    monkeypatch.setattr("ledger.money.cost_groups.MAX_GROUPS", 3)
    error = assert_error(as_owner.get(f"/api/jobs/{job.pk}/costs", {"by": "title"}), 400, "invalid", {"by"})
    assert "/export" in error["fields"]["by"]
    assert costs(as_owner, job)["results"]  # three categories are within it


def test_roles(api_as, as_outsider, admin_person, job):
    address = f"/api/jobs/{job.pk}/costs?by=category"
    assert_error(ApiClient(None).get(address), 401, "unauthenticated")
    assert_error(ApiClient("not-a-token").get(address), 401)
    assert_error(as_outsider.get(address), 403, "forbidden")
    assert_error(api_as(admin_person).get("/api/jobs/987654321/costs?by=category"), 404, "not_found")
    assert_error(api_as(admin_person).post(address), 405)
    assert api_as(admin_person).get(address).status_code == 200
