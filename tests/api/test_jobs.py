"""Jobs through the API: starting one (idempotently), reading it, its items, and cancelling it."""

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.models import DEFAULT_UNIT_SIZE, MAX_NAMED_SKUS, Event, Item, Job, PromptVersion, Submission
from ledger.states import ItemState, JobState
from review.api.shapes import SUBMISSIONS_SHOWN
from tests.api.conftest import assert_error
from tests.factories import ItemFactory, JobFactory, ProductFactory, UserFactory, add_version

pytestmark = pytest.mark.django_db

BODY = {"reference": "spring-2026", "task": "product_description", "provider": "emulator"}


@pytest.mark.parametrize(
    ("provider", "env", "unit_size"),
    [
        ("cloudflare", {"CLOUDFLARE_API_TOKEN": "t", "CLOUDFLARE_ACCOUNT_ID": "a"}, 1_000),
        ("openai_compatible", {"OPENAI_COMPATIBLE_BASE_URL": "http://127.0.0.1:9/v1"}, 200),
    ],
)
def test_a_job_that_names_no_model_or_unit_size_takes_its_providers(
    as_owner, monkeypatch, settings, provider, env, unit_size
):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ProductFactory.create_batch(2)
    body = {**BODY, "provider": provider}

    assert as_owner.post_json("/api/jobs", body).status_code == 202
    # The same request again is the same job: the defaults are part of what was asked for.
    assert as_owner.post_json("/api/jobs", body).status_code == 200

    job = Job.objects.get()
    assert job.model == settings.PROVIDERS[provider]["default_model"]
    assert job.unit_size == unit_size  # the usual 5,000, cut to the provider's limit


def test_naming_more_skus_than_a_job_may_is_400_and_changes_nothing(as_owner):
    ProductFactory()
    before = snapshot()
    skus = [f"SKU-{n}" for n in range(MAX_NAMED_SKUS + 1)]

    response = as_owner.post_json("/api/jobs", {**BODY, "skus": skus})

    error = assert_error(response, 400, "invalid", {"skus"})
    assert f"at most {MAX_NAMED_SKUS:,}" in error["fields"]["skus"]
    assert snapshot() == before


def snapshot() -> tuple[int, int, int]:
    return Job.objects.count(), Item.objects.count(), Event.objects.count()


# --- starting a job ------------------------------------------------------------------------


def test_a_job_starts_with_every_active_product_and_the_defaults(as_owner, owner):
    active = ProductFactory.create_batch(3)
    ProductFactory(status="withdrawn")
    response = as_owner.post_json("/api/jobs", BODY)
    assert response.status_code == 202, response.content
    body = response.json()
    job = Job.objects.get()
    assert body == {
        "id": job.pk,
        "reference": "spring-2026",
        "state": JobState.PREPARING,
        "url": f"http://testserver/api/jobs/{job.pk}",
    }
    assert (job.owner, job.model, job.destination, job.unit_size) == (
        owner,
        "gpt-4o-mini",
        "catalogue",
        DEFAULT_UNIT_SIZE,
    )
    assert job.prompt_version.version == 1
    assert {i.product for i in job.items.all()} == set(active)


def test_a_job_for_named_skus(as_owner):
    wanted, _other = ProductFactory(), ProductFactory()
    body = {**BODY, "skus": [wanted.sku], "model": "gpt-4o", "unit_size": 10, "prompt_version": 1}
    assert as_owner.post_json("/api/jobs", body).status_code == 202
    job = Job.objects.get()
    assert [i.product for i in job.items.all()] == [wanted]
    assert (job.model, job.unit_size) == ("gpt-4o", 10)


def test_the_same_request_again_returns_the_same_job(as_owner):
    products = ProductFactory.create_batch(2)
    body = {**BODY, "skus": [p.sku for p in products]}
    first = as_owner.post_json("/api/jobs", body)
    before = snapshot()
    again = as_owner.post_json("/api/jobs", {**body, "skus": [p.sku for p in reversed(products)]})
    assert again.status_code == 200
    assert again.json() == first.json()
    assert snapshot() == before


@pytest.mark.parametrize(
    "extra",
    [
        {"model": None},
        {"destination": None, "unit_size": None, "prompt_version": None},
        {"task": " product_description "},
    ],
)
def test_a_repeat_is_compared_as_the_form_reads_it(as_owner, extra):
    """Null means "the default" and text is stripped, on the first request and on its repeat alike."""
    ProductFactory()
    first = as_owner.post_json("/api/jobs", {**BODY, **extra})
    assert first.status_code == 202, first.content
    again = as_owner.post_json("/api/jobs", {**BODY, **extra})
    assert again.status_code == 200, again.content
    assert again.json()["id"] == first.json()["id"]


def test_a_repeat_without_skus_compares_the_other_fields_only(as_owner):
    ProductFactory()
    first = as_owner.post_json("/api/jobs", BODY).json()
    ProductFactory()  # the catalogue grew since: still the same request
    before = snapshot()
    again = as_owner.post_json("/api/jobs", BODY)
    assert again.status_code == 200 and again.json()["id"] == first["id"]
    assert snapshot() == before


@pytest.mark.parametrize(
    "change",
    [{"model": "gpt-4o"}, {"unit_size": 7}, {"provider": "openai"}, {"prompt_version": 2}, {"skus": "other"}],
)
def test_the_same_reference_for_different_work_is_409_and_changes_nothing(as_owner, change, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")  # openai is configured, as in a deployment
    first, other = ProductFactory(), ProductFactory()
    PromptVersion.objects.create(
        task="product_description", version=2, system_message="s", template="{title}", output_schema={}
    )
    assert (
        as_owner.post_json("/api/jobs", {**BODY, "skus": [first.sku], "prompt_version": 1}).status_code == 202
    )
    before = snapshot()
    if change.get("skus") == "other":
        change = {"skus": [first.sku, other.sku]}
    response = as_owner.post_json("/api/jobs", {**BODY, "skus": [first.sku], "prompt_version": 1, **change})
    error = assert_error(response, 409, "reference_in_use", {"reference"})
    assert next(iter(change)) in error["message"]
    assert snapshot() == before


def test_another_persons_reference_is_409(as_owner, api_as):
    ProductFactory()
    assert as_owner.post_json("/api/jobs", BODY).status_code == 202
    before = snapshot()
    other = api_as(UserFactory(roles=["catalogue_owner"]))
    assert_error(other.post_json("/api/jobs", BODY), 409, "reference_in_use")
    assert snapshot() == before


@pytest.mark.parametrize(
    "body, fields",
    [
        ({}, {"reference", "task", "provider"}),
        ({**BODY, "reference": "  "}, {"reference"}),
        ({**BODY, "reference": "x" * 201}, {"reference"}),
        ({**BODY, "reference": "nul\x00"}, {"reference"}),
        ({**BODY, "task": 3, "model": ""}, {"task", "model"}),
        ({**BODY, "provider": "nobody"}, {"provider"}),
        ({**BODY, "destination": "nowhere"}, {"destination"}),
        ({**BODY, "task": "poems"}, {"task"}),
        ({**BODY, "prompt_version": 9}, {"prompt_version"}),
        ({**BODY, "prompt_version": "1"}, {"prompt_version"}),
        ({**BODY, "unit_size": 0}, {"unit_size"}),
        ({**BODY, "unit_size": True}, {"unit_size"}),
        ({**BODY, "unit_size": 50_001}, {"unit_size"}),
        ({**BODY, "skus": []}, {"skus"}),
        ({**BODY, "skus": "SKU-1"}, {"skus"}),
        ({**BODY, "skus": ["no spaces allowed"]}, {"skus"}),
        ({**BODY, "skus": ["UNKNOWN-1"]}, {"skus"}),
        ({**BODY, "sku": ["typo-for-skus"]}, {"sku"}),
    ],
)
def test_bad_input_is_400_naming_the_fields_and_changes_nothing(as_owner, body, fields):
    ProductFactory()
    before = snapshot()
    assert_error(as_owner.post_json("/api/jobs", body), 400, "invalid", fields)
    assert snapshot() == before


@pytest.mark.parametrize(
    "raw", ["{not json", "[1, 2]", '"text"', '{"a": 1, "a": 2}', '{"n": NaN}', "[" * 100_000]
)
def test_malformed_json_is_400(as_owner, raw):
    assert_error(as_owner.post_json("/api/jobs", raw), 400, "malformed_json")
    assert not Job.objects.exists()


def test_invalid_utf8_is_400(as_owner):
    assert_error(as_owner.post_json("/api/jobs", b'{"reference": "\xff"}'), 400, "malformed_json")


def test_a_job_the_ledger_refuses_is_409(as_owner):
    withdrawn = ProductFactory(status="withdrawn")
    assert_error(as_owner.post_json("/api/jobs", {**BODY, "skus": [withdrawn.sku]}), 409, "not_allowed")
    assert not Job.objects.exists()


# --- reading jobs --------------------------------------------------------------------------


def test_a_submission_the_provider_refuses_says_since_when_and_until_when(as_operator):
    job = JobFactory()
    Submission.objects.create(
        job=job,
        provider="emulator",
        model="gpt-4o-mini",
        intent_key="bd_1",
        state="open",
        provider_ref="batch_1",
        refusing_since=datetime(2026, 3, 1, 9, 30, tzinfo=UTC),
    )
    [submission] = as_operator.get(f"/api/jobs/{job.pk}").json()["submissions"]
    assert (submission["refusing_since"], submission["gives_up_at"]) == (
        "2026-03-01T09:30:00Z",
        "2026-03-02T09:30:00Z",
    )


def test_a_job_shows_counts_for_every_state_submissions_and_cost(as_operator):
    job = JobFactory()
    draft = add_version(ItemFactory(job=job, awaiting_review=True))
    ItemFactory(job=job, submitted=True)
    Submission.objects.create(
        job=job,
        provider="emulator",
        model="gpt-4o-mini",
        intent_key="bd_1",
        state="open",
        provider_ref="batch_1",
        last_observed_status="in_progress",
        request_counts={"total": 1},
        anomalies=[{"kind": "unknown_custom_id", "custom_id": "bd-x"}],
    )
    response = as_operator.get(f"/api/jobs/{job.pk}")
    assert response.status_code == 200
    body = response.json()
    assert body["id"] == job.pk and body["reference"] == job.reference and body["state"] == job.state
    assert list(body["counts"]) == ItemState.values
    assert body["counts"]["awaiting_review"] == 1 and body["counts"]["submitted"] == 1
    assert sum(body["counts"].values()) == body["item_count"] == 2
    [submission] = body["submissions"]
    assert {
        "provider_ref": "batch_1",
        "state": "open",
        "last_observed_at": None,
        "last_observed_status": "in_progress",
        "request_counts": {"total": 1},
        "anomalies": [{"kind": "unknown_custom_id", "custom_id": "bd-x"}],
        "refusing_since": None,
        "gives_up_at": None,
    }.items() <= submission.items()
    assert float(body["cost"]["total"]) > 0 and body["cost"]["input_tokens"] == draft.input_tokens


def test_a_job_shows_its_first_submissions_and_pages_through_all_of_them(as_operator):
    """A job of a million items at 500 a unit has 2,000 submissions: the job shows the first ones and
    how many there are; `submissions_url` pages through every one."""
    job = JobFactory()
    made = Submission.objects.bulk_create(
        Submission(job=job, provider="emulator", model="m", intent_key=f"bd_{n}", provider_ref=f"batch_{n}")
        for n in range(SUBMISSIONS_SHOWN + 5)
    )
    other = JobFactory()
    Submission.objects.create(job=other, provider="emulator", model="m", intent_key="bd_other")
    body = as_operator.get(f"/api/jobs/{job.pk}").json()
    assert [s["id"] for s in body["submissions"]] == [s.pk for s in made[:SUBMISSIONS_SHOWN]]
    assert body["submission_count"] == SUBMISSIONS_SHOWN + 5
    listed = as_operator.get("/api/jobs").json()["results"]
    assert {j["id"]: j["submission_count"] for j in listed} == {job.pk: SUBMISSIONS_SHOWN + 5, other.pk: 1}
    seen, url = [], body["submissions_url"]
    while url:
        page = as_operator.get(url).json()
        assert page["count"] == SUBMISSIONS_SHOWN + 5
        seen += [s["id"] for s in page["results"]]
        url = page["next"]
    assert seen == [s.pk for s in made]
    assert as_operator.get(f"/api/jobs/{job.pk}/submissions?page=junk").status_code == 400
    assert_error(as_operator.get("/api/jobs/999999/submissions"), 404, "not_found")


def test_an_unknown_job_is_404(as_owner):
    assert_error(as_owner.get("/api/jobs/999999"), 404, "not_found")
    assert_error(as_owner.get(f"/api/jobs/{2**70}"), 404, "not_found")


def test_jobs_are_listed_newest_first_a_page_at_a_time(as_owner):
    jobs = JobFactory.create_batch(27)
    ItemFactory(job=jobs[-1])
    first = as_owner.get("/api/jobs").json()
    assert first["count"] == 27 and len(first["results"]) == 25
    assert first["results"][0]["id"] == jobs[-1].pk
    assert first["results"][0]["counts"]["prepared"] == 1
    assert first["next"] == "http://testserver/api/jobs?page=2"
    second = as_owner.get(first["next"]).json()
    assert [j["id"] for j in second["results"]] == [jobs[1].pk, jobs[0].pk] and second["next"] is None


def test_the_job_list_takes_the_same_queries_for_more_jobs(as_owner):
    JobFactory.create_batch(2)
    as_owner.get("/api/jobs")  # the token's first use is recorded, once
    with CaptureQueriesContext(connection) as few:
        as_owner.get("/api/jobs")
    for job in JobFactory.create_batch(10):
        add_version(ItemFactory(job=job, awaiting_review=True))
    with CaptureQueriesContext(connection) as many:
        as_owner.get("/api/jobs")
    assert len(many) == len(few)


# --- a job's items -------------------------------------------------------------------------


def test_items_are_paginated_by_50_and_filtered(as_owner):
    job = JobFactory()
    items = [ItemFactory(job=job) for _ in range(51)]
    rejected = ItemFactory(job=job, state=ItemState.REJECTED, reason="Too vague")
    ItemFactory()  # another job's
    page = as_owner.get(f"/api/jobs/{job.pk}/items").json()
    assert page["count"] == 52 and len(page["results"]) == 50
    assert page["results"][0] == {
        "id": items[0].pk,
        "job": job.pk,
        "sku": items[0].product.sku,
        "source_revision": 1,
        "state": "prepared",
        "label": "Waiting to be sent to the model",
        "reason": "",
        **{k: page["results"][0][k] for k in ("custom_id", "updated_at", "url")},
    }
    assert page["next"].endswith(f"/api/jobs/{job.pk}/items?page=2")
    filtered = as_owner.get(f"/api/jobs/{job.pk}/items", {"state": "rejected"}).json()
    assert [i["id"] for i in filtered["results"]] == [rejected.pk] and filtered["next"] is None
    assert filtered["results"][0]["reason"] == "Too vague"
    by_sku = as_owner.get(f"/api/jobs/{job.pk}/items", {"sku": items[3].product.sku}).json()
    assert [i["id"] for i in by_sku["results"]] == [items[3].pk]


def test_item_filters_keep_their_query_in_the_next_link(as_owner):
    job = JobFactory()
    for _ in range(51):
        ItemFactory(job=job)
    page = as_owner.get(f"/api/jobs/{job.pk}/items", {"state": "prepared"}).json()
    assert "state=prepared" in page["next"] and "page=2" in page["next"]


@pytest.mark.parametrize(
    "query, field",
    [({"state": "done"}, {"state"}), ({"page": "zero"}, {"page"}), ({"sku": "nul\x00"}, {"sku"})],
)
def test_bad_item_filters_are_400(as_owner, query, field):
    job = JobFactory()
    assert_error(as_owner.get(f"/api/jobs/{job.pk}/items", query), 400, "invalid", field)


def test_items_of_an_unknown_job_or_page_are_404(as_owner):
    job = JobFactory()
    ItemFactory(job=job)
    assert_error(as_owner.get("/api/jobs/999999/items"), 404)
    assert_error(as_owner.get(f"/api/jobs/{job.pk}/items", {"page": 2}), 404)


# --- cancelling ----------------------------------------------------------------------------


def cancellable_job(owner=None) -> tuple[Job, list[Item], list[Item]]:
    """Items not used yet (waiting for the model, a reviewer, an operator) and items that are."""
    job = JobFactory(owner=owner) if owner else JobFactory()
    waiting = [
        ItemFactory(job=job),
        ItemFactory(job=job, submitted=True),
        ItemFactory(job=job, state=ItemState.SUBMISSION_UNCERTAIN),
        ItemFactory(job=job, awaiting_review=True),
        ItemFactory(job=job, state=ItemState.DEAD_LETTER),
    ]
    add_version(waiting[3])
    used = [ItemFactory(job=job, state=ItemState.APPLYING), ItemFactory(job=job, state=ItemState.APPLIED)]
    return job, waiting, used


def test_an_operator_cancels_what_has_not_been_used(as_operator, operator):
    job, waiting, used = cancellable_job()
    response = as_operator.post_json(f"/api/jobs/{job.pk}/cancel")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["state"] == "cancelled" and body["items_cancelled"] == 5
    assert body["counts"]["cancelled"] == 5
    assert body["counts"]["applying"] == 1 and body["counts"]["applied"] == 1
    for item in waiting:
        item.refresh_from_db()
        assert item.state == ItemState.CANCELLED
        assert item.events.get(to_state=ItemState.CANCELLED).reason == f"Job cancelled by {operator.username}"
    # An application under way may be landing right now: it finishes; applied text stays applied.
    assert [Item.objects.get(pk=item.pk).state for item in used] == [ItemState.APPLYING, ItemState.APPLIED]
    job_event = Event.objects.get(job=job, item=None)
    assert (job_event.from_state, job_event.to_state, job_event.actor) == ("preparing", "cancelled", operator)


def test_a_catalogue_owner_cancels_only_their_own_jobs(as_owner, owner):
    others, _, _ = cancellable_job()
    assert_error(as_owner.post_json(f"/api/jobs/{others.pk}/cancel"), 403)
    assert Job.objects.get(pk=others.pk).state == JobState.PREPARING
    own, _, _ = cancellable_job(owner=owner)
    assert as_owner.post_json(f"/api/jobs/{own.pk}/cancel").status_code == 200


@pytest.mark.parametrize(
    "state, item_state",
    [(JobState.COMPLETED, ItemState.APPLIED), (JobState.CANCELLED, ItemState.PREPARED)],
)
def test_a_finished_job_cannot_be_cancelled(as_operator, state, item_state):
    job = JobFactory(state=state)
    item = ItemFactory(job=job, state=item_state)
    before = snapshot()
    assert_error(as_operator.post_json(f"/api/jobs/{job.pk}/cancel"), 409, "not_allowed")
    assert snapshot() == before and Item.objects.get(pk=item.pk).state == item_state


def test_cancelling_an_unknown_job_is_404_and_a_body_is_refused(as_operator):
    assert_error(as_operator.post_json("/api/jobs/999999/cancel"), 404)
    job = JobFactory()
    assert_error(as_operator.post_json(f"/api/jobs/{job.pk}/cancel", {"force": True}), 400, "invalid")


def test_items_of_a_cancelled_job_are_not_retried(as_operator):
    job = JobFactory(state=JobState.CANCELLED)
    item = ItemFactory(job=job, state=ItemState.REJECTED)
    assert_error(as_operator.post_json(f"/api/items/{item.pk}/retry", {"unit": "inference"}), 409)
