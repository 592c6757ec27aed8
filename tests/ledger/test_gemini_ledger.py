"""The ledger over Gemini Batch Mode: the collector's own round (`poll_everything`) driving the
Gemini adapter against its emulator over real HTTP, with the faults that shape Gemini's results."""

import time

import pytest

from ledger.actions.collecting import collect_submission, poll_submission
from ledger.actions.submitting import plan_submissions, send_submission
from ledger.emulators.clock import TestClock
from ledger.emulators.gemini import GeminiEmulator
from ledger.models import Event, GeneratedVersion, Item, Submission, SubmissionItem
from ledger.states import ItemState, ReasonCode
from tests.collector import poll_everything
from tests.factories import JobFactory, ProductFactory

pytestmark = pytest.mark.django_db

SETTLED = {ItemState.AWAITING_REVIEW, ItemState.VALIDATION_FAILED, ItemState.DEAD_LETTER, ItemState.OBSOLETE}


@pytest.fixture
def emulator(settings, monkeypatch):
    settings.BATCHDESK_RETRY_BASE_SECONDS = 0
    settings.BATCHDESK_UNCERTAIN_GRACE_SECONDS = 0.5
    monkeypatch.setenv("GEMINI_API_KEY", "test-key")
    # The emulator's time moves with the collector's rounds (`clock.advance`), never by itself.
    with GeminiEmulator(per_request_ms=1, pending_ms=10, seed=9, clock=TestClock()) as running:
        settings.PROVIDERS = {
            **settings.PROVIDERS,
            "gemini": {**settings.PROVIDERS["gemini"], "base_url": running.base_url},
        }
        yield running


def job_with_items(n: int, unit_size: int = 5):
    job = JobFactory(provider="gemini", model="gemini-2.5-flash", unit_size=unit_size)
    for _ in range(n):
        product = ProductFactory()
        Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    return job


def run_collector(emulator, job, *, timeout: float = 20.0) -> dict:
    """Collector rounds, the emulator's clock 50 ms on after each, until the job's items settle.
    The real pause between rounds is the ledger's own (its grace period for a lost answer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        poll_everything()
        counts = job.items.counts_by_state()
        if set(counts) <= SETTLED:
            return counts
        emulator.clock.advance(ms=50)
        time.sleep(0.05)
    raise AssertionError(f"not settled: {job.items.counts_by_state()}")


def assert_paid_once(emulator, job):
    inferences = emulator.stats()["inferences"]
    sent = set(SubmissionItem.objects.filter(item__job=job).values_list("custom_id", flat=True))
    assert set(inferences) <= sent
    assert max(inferences.values()) == 1


def test_a_job_runs_through_gemini_to_review(emulator):
    job = job_with_items(7, unit_size=3)

    counts = run_collector(emulator, job)

    assert counts == {ItemState.AWAITING_REVIEW: 7}
    assert_paid_once(emulator, job)
    submissions = Submission.objects.filter(job=job)
    assert submissions.count() == 3
    assert {s.last_observed_status for s in submissions} == {"BATCH_STATE_SUCCEEDED"}
    assert all(s.provider_ref.startswith("batches/") for s in submissions)


def test_a_lost_create_answer_is_adopted_by_display_name_not_sent_twice(emulator):
    emulator.configure(lose_create_responses=[1])
    job = job_with_items(5)

    counts = run_collector(emulator, job)

    assert counts == {ItemState.AWAITING_REVIEW: 5}
    stats = emulator.stats()
    assert stats["creates"] == 1 and list(stats["batches_by_intent"].values()) == [1]
    assert_paid_once(emulator, job)


def test_an_expired_batch_is_retried_as_transient(emulator):
    emulator.configure(expire_rate=1.0)
    job = job_with_items(3)
    for _ in range(40):
        poll_everything()
        if Submission.objects.filter(job=job, last_observed_status="BATCH_STATE_EXPIRED").exists():
            break
        emulator.clock.advance(ms=50)
    emulator.configure(expire_rate=0.0)

    counts = run_collector(emulator, job)

    assert counts == {ItemState.AWAITING_REVIEW: 3}
    expired = Submission.objects.get(job=job, last_observed_status="BATCH_STATE_EXPIRED")
    assert expired.unanswered_reason == ReasonCode.BATCH_EXPIRED
    assert Submission.objects.filter(job=job).count() == 2
    assert_paid_once(emulator, job)


def test_repeated_unknown_and_malformed_answers_change_nothing_but_are_recorded(emulator):
    emulator.configure(duplicate_lines=1.0, unknown_lines=1, malformed_lines=2)
    job = job_with_items(4)

    counts = run_collector(emulator, job)

    assert counts == {ItemState.AWAITING_REVIEW: 4}
    for item in job.items.all():
        assert item.versions.count() == 1
    kinds = [a["kind"] for s in Submission.objects.filter(job=job) for a in s.anomalies]
    assert (
        kinds.count("repeated_line"),
        kinds.count("unknown_custom_id"),
        kinds.count("unreadable_line"),
    ) == (4, 1, 2)


def test_answers_that_name_no_request_are_neither_guessed_by_position_nor_paid_for_again(emulator):
    """Gemini has been reported to answer inline requests without their metadata: then no answer
    says which request it is. Matching them by position would be a guess (rule 2); sending the
    requests again would pay twice for work that was done (rule 3). The unit waits, saying why."""
    emulator.configure(keyless_responses=True)
    job = job_with_items(3)

    def read_once_ended():
        poll_everything()
        submission = Submission.objects.filter(job=job).first()
        return submission is not None and "metadata.key" in submission.error

    deadline = time.monotonic() + 20
    while not read_once_ended():
        assert time.monotonic() < deadline, Submission.objects.filter(job=job).values("state", "error")
        emulator.clock.advance(ms=50)
    for _ in range(5):  # more rounds change nothing
        poll_everything()

    submission = Submission.objects.get(job=job)
    assert submission.state == "ended"
    assert "3 responses" in submission.error and "never matched by position" in submission.error
    assert job.items.counts_by_state() == {ItemState.SUBMITTED: 3}
    assert not SubmissionItem.objects.filter(submission=submission).exclude(outcome="").exists()
    stats = emulator.stats()
    assert stats["creates"] == 1
    assert sorted(stats["inferences"].values()) == [1, 1, 1]


# --- units sent as a file ------------------------------------------------------------------------


@pytest.fixture
def by_file(emulator, settings):
    """Every unit goes by file: the inline limit is set to nothing, as a deployment may lower it
    (`settings.PROVIDERS["gemini"]["inline_max_requests"]`)."""
    settings.PROVIDERS = {
        **settings.PROVIDERS,
        "gemini": {**settings.PROVIDERS["gemini"], "inline_max_requests": 0},
    }
    return emulator


def uploaded(emulator) -> int:
    return sum(source == "UPLOADED" for source in emulator.stats()["files"].values())


def test_a_job_sent_by_file_runs_through_gemini_to_review(by_file):
    job = job_with_items(7, unit_size=3)

    counts = run_collector(by_file, job)

    assert counts == {ItemState.AWAITING_REVIEW: 7}
    assert_paid_once(by_file, job)
    submissions = Submission.objects.filter(job=job)
    assert submissions.count() == 3
    # Each unit uploaded one file; once collected, it and the unit's responses file were deleted at
    # the provider (no other upload is left behind).
    deleted = Event.objects.filter(submission__job=job, data__has_key="provider_files_deleted")
    assert sorted(len(event.data["provider_files_deleted"]) for event in deleted) == [2, 2, 2]
    assert uploaded(by_file) == 0
    assert {s.last_observed_status for s in submissions} == {"BATCH_STATE_SUCCEEDED"}
    assert all(s.anomalies == [] for s in submissions)
    # Each unit's responses file was downloaded once, and each draft carries its own usage.
    assert sorted(by_file.stats()["downloads"].values()) == [1, 1, 1]
    for version in GeneratedVersion.objects.filter(item__job=job):
        assert version.usage["totalTokenCount"] > 0


def test_a_cut_download_of_a_responses_file_is_repeated_harmlessly(by_file):
    by_file.configure(cut_downloads=1)
    job = job_with_items(8, unit_size=8)
    [submission_id] = plan_submissions(job.pk)
    send_submission(submission_id)
    results = []
    for _ in range(200):
        results.append(poll_submission(submission_id))
        if results[-1] in ("collected", "interrupted"):
            break
        by_file.clock.advance(ms=20)

    assert results[-1] == "interrupted"
    half = GeneratedVersion.objects.filter(item__job=job).count()
    assert 0 < half < 8
    assert "interrupted" in Submission.objects.get(pk=submission_id).error
    Submission.objects.filter(pk=submission_id).update(claimed_until=None)
    assert collect_submission(submission_id) == "collected"

    assert GeneratedVersion.objects.filter(item__job=job).count() == 8
    assert Submission.objects.get(pk=submission_id).anomalies == []
    assert job.items.counts_by_state() == {ItemState.AWAITING_REVIEW: 8}
    assert list(by_file.stats()["downloads"].values()) == [2]
    assert_paid_once(by_file, job)


def test_repeated_unknown_and_keyless_lines_of_a_file_change_nothing_but_are_recorded(by_file):
    by_file.configure(duplicate_lines=1.0, unknown_lines=1, malformed_lines=2)
    job = job_with_items(4)

    counts = run_collector(by_file, job)

    assert counts == {ItemState.AWAITING_REVIEW: 4}
    for item in job.items.all():
        assert item.versions.count() == 1
    [submission] = Submission.objects.filter(job=job)
    kinds = [a["kind"] for a in submission.anomalies]
    assert (
        kinds.count("repeated_line"),
        kinds.count("unknown_custom_id"),
        kinds.count("unreadable_line"),
    ) == (4, 1, 2)
    problems = sorted(
        a["problem"].split(":")[0] for a in submission.anomalies if a["kind"] == "unreadable_line"
    )
    assert problems == ["no key", "not JSON"]
    assert_paid_once(by_file, job)


def test_a_file_whose_lines_name_no_request_is_neither_guessed_nor_paid_for_again(by_file):
    by_file.configure(keyless_responses=True)
    job = job_with_items(3)

    deadline = time.monotonic() + 20
    while True:
        poll_everything()
        submission = Submission.objects.filter(job=job).first()
        if submission is not None and "none naming its request" in submission.error:
            break
        assert time.monotonic() < deadline, Submission.objects.filter(job=job).values("state", "error")
        by_file.clock.advance(ms=50)
    for _ in range(5):  # more rounds change nothing
        poll_everything()

    submission = Submission.objects.get(job=job)
    assert submission.state == "ended"
    assert job.items.counts_by_state() == {ItemState.SUBMITTED: 3}
    assert not SubmissionItem.objects.filter(submission=submission).exclude(outcome="").exists()
    assert submission.anomalies == []
    stats = by_file.stats()
    assert stats["creates"] == 1 and uploaded(by_file) == 1
    assert sorted(stats["inferences"].values()) == [1, 1, 1]


def test_a_lost_create_answer_after_an_upload_is_adopted_not_sent_twice(by_file):
    by_file.configure(lose_create_responses=[1])
    job = job_with_items(5)

    counts = run_collector(by_file, job)

    assert counts == {ItemState.AWAITING_REVIEW: 5}
    stats = by_file.stats()
    assert stats["creates"] == 1 and list(stats["batches_by_intent"].values()) == [1]
    assert_paid_once(by_file, job)
