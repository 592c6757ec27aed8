"""Collection records results a chunk at a time (`record_chunk`); the line-by-line path it replaced
(`record_result` for each line, as `collect_submission` did before) stays as its reference. The
same provider output, collected both ways into two jobs over the same products, leaves the same
states, versions, events, entries and anomalies, whatever the chunk size."""

import json
import re
import sys
import threading

import pytest

from ledger.actions import collecting
from ledger.actions.collecting import collect_submission
from ledger.actions.core import change_state
from ledger.actions.job_states import refresh_job_state
from ledger.actions.products import record_product, withdraw_product
from ledger.actions.submitting import set_submission_state
from ledger.models import (
    Event,
    GeneratedVersion,
    Item,
    Job,
    Product,
    Submission,
    SubmissionItem,
    canonical_json,
    compact_json,
)
from ledger.providers.base import ResultLine, UnreadableLine
from ledger.states import DraftNote, ItemState, ReasonCode, SubmissionState
from ledger.workers.thread_switching import SWITCH_INTERVAL
from tests.factories import JobFactory, ProductFactory
from tests.ledger import row_recorder

pytestmark = pytest.mark.django_db

GOOD = {
    "headline": "Oak chopping board",
    "description": "A chopping board made from oak. It measures 40 x 25 cm and is ready for daily use.",
}


def draft(**changes) -> str:
    return json.dumps({**GOOD, **changes})


def success(content: str, **usage) -> dict:
    return {"succeeded": True, "content": content, "input_tokens": 100, "output_tokens": 40, **usage}


def failure(code: str, *, transient: bool, reason: str = ReasonCode.MODEL_SERVER_ERROR) -> dict:
    return {
        "succeeded": False,
        "error_code": code,
        "error_message": f"the model said {code}",
        "reason": reason,
        "transient": transient,
    }


# What happens to each product's request, and what the provider's result for it is.
STORIES = [
    ("valid", success(draft())),
    ("unstated claim", success(draft(description=GOOD["description"] + " Waterproof and vegan."))),
    ("not json", success("Just prose, no JSON at all, but long enough to be a description.")),
    ("schema", success(json.dumps({"headline": "Only a headline"}))),
    ("apportioned usage", success(draft(), apportioned=True, usage={"total_tokens": 140})),
    ("transient", failure("server_error", transient=True)),
    ("transient, last attempt", failure("server_error", transient=True)),
    ("transient, retry-after", {**failure("rate_limit_exceeded", transient=True), "retry_after": 90.0}),
    ("permanent", failure("invalid_request_error", transient=False, reason=ReasonCode.REQUEST_INVALID)),
    ("withdrawn meanwhile", success(draft())),
    ("revised meanwhile", success(draft())),
    ("revised meanwhile, failed", failure("server_error", transient=True)),
    ("cancelled meanwhile", success(draft())),
    ("already recorded", success(draft())),
    ("repeated", success(draft())),
    ("valid again", success(draft(headline="Another oak board"))),
    ("no line", None),
    ("already approved", success(draft())),
    ("cut off", success(draft()[:30], truncated=True)),
    ("fenced", success(f"```json\n{draft(headline='Fenced oak board')}\n```\n")),
    ("refused", failure("refusal", transient=False, reason=ReasonCode.REFUSED_BY_MODEL)),
]


def make_jobs() -> tuple[Job, Job]:
    products = [ProductFactory() for _ in STORIES]
    jobs = JobFactory(reference="line by line"), JobFactory(reference="in chunks")
    for job in jobs:
        submission = Submission.objects.create(
            job=job,
            provider="emulator",
            model="m",
            intent_key=f"k-{job.pk}",
            state=SubmissionState.ENDED,
            request_counts={"total": 17, "succeeded": 12, "failed": 5},
        )
        for product in products:
            item = Item.objects.create(
                job=job,
                product=product,
                source_revision=product.current_revision,
                state=ItemState.SUBMITTED,
                submission=submission,
            )
            SubmissionItem.objects.create(submission=submission, item=item, custom_id=item.custom_id)
    return jobs


def happen_meanwhile(jobs) -> None:
    """What changed while the requests were at the provider: the same for both jobs."""
    products = list(Product.objects.order_by("sku"))
    for job in jobs:
        items = list(Item.objects.filter(job=job).order_by("product__sku"))
        for (story, _), item in zip(STORIES, items, strict=True):
            if story == "transient, last attempt":
                Item.objects.filter(pk=item.pk).update(inference_failures=2)
            if story == "cancelled meanwhile":
                change_state(item.pk, to=ItemState.CANCELLED, reason="cancelled by a test")
            if story == "already approved":
                Item.objects.filter(pk=item.pk).update(state=ItemState.APPROVED)
    for (story, _), product in zip(STORIES, products, strict=True):
        if story == "withdrawn meanwhile":
            withdraw_product(sku=product.sku)
        if story.startswith("revised meanwhile"):
            revision = product.current_revision
            record_product(sku=product.sku, title=revision.title + " (new)", fields=revision.fields)


def provider_output(job: Job) -> list:
    """The results file of the job's submission, in the provider's (not the ledger's) order."""
    items = list(Item.objects.filter(job=job).order_by("product__sku"))
    lines: list = [UnreadableLine(7, "{not json", "not JSON: Expecting property name")]
    for (story, result), item in zip(STORIES, items, strict=True):
        if result is None:
            continue
        line = ResultLine(custom_id=f"bd-{item.pk}-1", **result)
        lines.append(line)
        if story == "repeated":
            lines.insert(2, line)
    lines.insert(5, ResultLine(custom_id=f"bd-unknown-{job.reference}", succeeded=True, content=draft()))
    return list(reversed(lines))


def collect_line_by_line(submission: Submission, lines: list) -> None:
    """`collect_submission` as it was before chunks: every line recorded alone by record_result."""
    from ledger.actions.submitting import note_anomaly

    seen: set[str] = set()
    counted = {"succeeded": 0, "failed": 0}
    for line in lines:
        if isinstance(line, ResultLine):
            if row_recorder.record_result(submission, line, seen=seen) != "repeated":
                counted["succeeded" if line.succeeded else "failed"] += 1
        else:
            note_anomaly(
                submission, "unreadable_line", line=line.line_number, problem=line.problem, text=line.text
            )
    for entry in submission.entries.filter(outcome="").order_by("id"):
        note_anomaly(submission, "missing_result", custom_id=entry.custom_id)
        missing = ResultLine(
            custom_id=entry.custom_id,
            succeeded=False,
            error_code="missing_result",
            error_message="The provider returned no line for this request",
            reason=ReasonCode.MISSING_RESULT,
            transient=True,
        )
        row_recorder.record_result(submission, missing, seen=seen)
    counts = submission.request_counts
    if (counts["succeeded"], counts["failed"]) != (counted["succeeded"], counted["failed"]):
        note_anomaly(submission, "counts_disagree", provider_counts=counts, lines_in_results=counted)
    set_submission_state(submission, SubmissionState.COLLECTED, claimed_until=None, error="")
    refresh_job_state(submission.job_id)


class Replay:
    """The provider's results file, as its adapter reads it, given to collect_submission."""

    def __init__(self, lines: list):
        self.lines = lines

    def results(self, provider_ref, *, skip=(), requests=()):
        yield from self.lines


def ledger_of(job: Job) -> dict:
    """Everything collection wrote for a job, in words that do not depend on row ids."""
    names, item_names = {}, {}
    for product_index, item in enumerate(Item.objects.filter(job=job).order_by("product__sku", "id")):
        names[f"bd-{item.pk}-1"] = f"request {product_index}"
        item_names[f"item {item.pk}"] = f"the item of request {product_index}"
    names[f"bd-unknown-{job.reference}"] = "unknown request"
    numbers = dict(GeneratedVersion.objects.filter(item__job=job).values_list("pk", "number"))

    def plain(data: dict) -> dict:
        data = dict(data)
        if "version" in data:
            data["version"] = f"version {numbers[data['version']]}"
        if "custom_id" in data:
            data["custom_id"] = names.get(data["custom_id"], data["custom_id"])
        return data

    items = []
    for item in Item.objects.filter(job=job).order_by("product__sku", "id"):
        items.append(
            {
                "product": item.product.sku,
                "revision": item.source_revision.number,
                "state": item.state,
                "reason": item.reason,
                "reason_code": item.reason_code,
                "inference_attempt": item.inference_attempt,
                "inference_failures": item.inference_failures,
                "waits_until_later": item.next_attempt_at is not None,
                "in_a_submission": item.submission_id is not None,
                "versions": list(
                    item.versions.order_by("number").values_list(
                        "number",
                        "content",
                        "raw_output",
                        "content_hash",
                        "valid",
                        "validation_reasons",
                        "validation_notes",
                        "input_tokens",
                        "output_tokens",
                        "usage",
                    )
                ),
                "entries": [
                    (names.get(custom_id, "?"), outcome)
                    for custom_id, outcome in item.submission_entries.values_list("custom_id", "outcome")
                ],
                "events": [
                    (
                        e.from_state,
                        e.to_state,
                        re.sub(r"item \d+", lambda m: item_names[m[0]], e.reason),
                        e.actor_name,
                        plain(e.data),
                    )
                    for e in Event.objects.filter(item=item).order_by("id")
                ],
            }
        )
    submission = Submission.objects.get(job=job)
    anomalies = [
        {key: names.get(value, value) if key == "custom_id" else value for key, value in anomaly.items()}
        for anomaly in submission.anomalies
    ]
    job.refresh_from_db()
    return {"items": items, "anomalies": anomalies, "submission": submission.state, "job": job.state}


@pytest.mark.parametrize("chunk", [1, 3, 2000])
def test_collecting_in_chunks_writes_what_collecting_line_by_line_writes(settings, chunk):
    collect_in_chunks_and_line_by_line(settings, chunk)


def collect_in_chunks_and_line_by_line(settings, chunk: int, *, anomalies_in_order: bool = True) -> None:
    settings.BATCHDESK_COLLECT_CHUNK = chunk
    by_line, in_chunks = make_jobs()
    happen_meanwhile([by_line, in_chunks])
    for job in (by_line, in_chunks):
        # Recorded by an earlier collection that died: the same line both ways.
        entry = SubmissionItem.objects.filter(item__job=job).order_by("item__product__sku")[13]
        row_recorder.record_result(
            Submission.objects.get(job=job),
            ResultLine(custom_id=entry.custom_id, succeeded=True, content=draft()),
        )

    collect_line_by_line(Submission.objects.get(job=by_line), provider_output(by_line))
    submission = Submission.objects.get(job=in_chunks)
    assert collect_submission(submission.pk, provider=Replay(provider_output(in_chunks))) == "collected"

    expected, got = ledger_of(by_line), ledger_of(in_chunks)
    if not anomalies_in_order:
        for ledger in (expected, got):
            ledger["anomalies"].sort(key=canonical_json)
    assert got == expected
    # The stories really happened (a comparison of two empty ledgers would pass too).
    states = {item["product"]: item["state"] for item in got["items"] if item["revision"] == 1}
    assert sorted(states.values()) == sorted(
        [
            ItemState.AWAITING_REVIEW,
            ItemState.VALIDATION_FAILED,
            ItemState.VALIDATION_FAILED,
            ItemState.VALIDATION_FAILED,
            ItemState.AWAITING_REVIEW,
            ItemState.PREPARED,
            ItemState.DEAD_LETTER,
            ItemState.PREPARED,
            ItemState.INFERENCE_FAILED,
            ItemState.WITHDRAWN,
            ItemState.OBSOLETE,
            ItemState.OBSOLETE,
            ItemState.CANCELLED,
            ItemState.AWAITING_REVIEW,
            ItemState.AWAITING_REVIEW,
            ItemState.AWAITING_REVIEW,
            ItemState.PREPARED,
            ItemState.APPROVED,
            ItemState.VALIDATION_FAILED,
            ItemState.AWAITING_REVIEW,
            ItemState.INFERENCE_FAILED,
        ]
    )
    assert {anomaly["kind"] for anomaly in got["anomalies"]} == {
        "unreadable_line",
        "repeated_line",
        "unknown_custom_id",
        "missing_result",
        "counts_disagree",
    }
    # Each revised product's current revision was queued as a new item, in both jobs.
    assert sum(item["revision"] == 2 for item in got["items"]) == 2
    assert {ReasonCode.TRUNCATED, ReasonCode.REFUSED_BY_MODEL} <= {
        item["reason_code"] for item in got["items"]
    }
    notes = [version[6] for item in got["items"] for version in item["versions"]]
    assert notes.count([DraftNote.READ_FROM_CODE_FENCE]) == 1


@pytest.mark.django_db(transaction=True)
def test_chunks_recorded_beside_the_reading_write_what_collecting_line_by_line_writes(settings, monkeypatch):
    """Outside a transaction (a worker's task), chunks are recorded by two threads, each on its own
    connection, while the next is read: the same ledger, every chunk recorded by those threads (the
    anomalies noted in the order their chunks committed, which may differ from the file's)."""
    threads, switch_intervals = [], set()
    record_chunk = collecting.record_chunk
    before = sys.getswitchinterval()

    def recorded_by(*args, **kwargs):
        threads.append(threading.current_thread().name)
        switch_intervals.add(sys.getswitchinterval())
        return record_chunk(*args, **kwargs)

    monkeypatch.setattr(collecting, "record_chunk", recorded_by)
    collect_in_chunks_and_line_by_line(settings, 3, anomalies_in_order=False)
    assert len(threads) > 3
    assert {name.rsplit("_", 1)[0] for name in threads} == {"record_chunk_0", "record_chunk_1"}
    # The threads were handed the interpreter sooner while they recorded, and only then.
    # Python keeps the interval in whole microseconds.
    assert switch_intervals and all(
        interval == pytest.approx(min(before, SWITCH_INTERVAL)) for interval in switch_intervals
    )
    assert sys.getswitchinterval() == before


def test_collecting_the_same_output_again_in_chunks_changes_nothing(settings):
    settings.BATCHDESK_COLLECT_CHUNK = 4
    _, job = make_jobs()
    submission = Submission.objects.get(job=job)
    output = provider_output(job)
    collect_submission(submission.pk, provider=Replay(output))
    before = ledger_of(job)
    item_events = Event.objects.filter(item__job=job).count()

    Submission.objects.filter(pk=submission.pk).update(state=SubmissionState.ENDED)
    assert collect_submission(submission.pk, provider=Replay(output)) == "collected"

    assert ledger_of(job) == before
    assert Event.objects.filter(item__job=job).count() == item_events


@pytest.mark.parametrize(
    "value",
    [
        [],
        {},
        {"version": 12},
        {"version": True},
        {"version": "12"},
        {"version": 1, "more": 2},
        ["a"],
        0,
        "",
        None,
        False,
        {"prompt_tokens": 116, "details": {"cached_tokens": 0}, "ratio": 0.5, "tier": "défault"},
        ["Too short: 3 characters", "Claims “waterproof”"],
        {"big": 10**30},  # beyond 64 bits: the json module writes it
        {"text": "\ud800"},  # a lone surrogate: the json module writes it (escaped)
        {1: "a key that is not text"},  # the json module writes it as "1"
    ],
    ids=repr,
)
def test_compact_json_reads_back_as_what_the_json_module_writes(value):
    """A JSON column keeps neither spacing nor key order: what is written must read back alike."""
    assert json.loads(compact_json(value)) == json.loads(json.dumps(value))
