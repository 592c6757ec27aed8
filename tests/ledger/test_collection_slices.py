"""A collection task stops after BATCHDESK_COLLECT_SECONDS at a chunk's end and hands the rest to
a fresh task, which goes on where it stopped. Here every task records one chunk of two lines and
hands over, for every provider: nothing is lost, nothing recorded or asked for twice (a server
answering request by request first hears the answers it was already asked for)."""

import time

import pytest

from ledger.actions.collecting import Chunk, collect_submission, observe_submission
from ledger.actions.submitting import plan_submissions, send_submission
from ledger.models import Event, GeneratedVersion, Item, Job, Submission, SubmissionItem
from ledger.providers import get_provider
from ledger.states import ItemState, SubmissionState
from tests.collector import poll_everything
from tests.ledger.test_provider_faults import (  # noqa: F401 - fixtures
    assert_paid_once,
    emulator,
    job_with_items,
    run_collector,
)
from tests.provider_emulators import BY_NAME, ONE_PER_PROTOCOL

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("provider", ONE_PER_PROTOCOL, ids=str)
def test_a_collection_cut_into_one_chunk_a_task_records_every_result_once(emulator, provider, settings):  # noqa: F811
    settings.BATCHDESK_COLLECT_SECONDS = 0
    settings.BATCHDESK_COLLECT_CHUNK = 2
    job = job_with_items(provider, 7, unit_size=7)

    counts = run_collector(job, until=lambda counts: set(counts) == {ItemState.AWAITING_REVIEW}, timeout=60)
    for _ in range(50):  # the last task finds nothing more to record and says so
        if Submission.objects.filter(job=job, state=SubmissionState.COLLECTED).exists():
            break
        poll_everything()

    assert counts == {ItemState.AWAITING_REVIEW: 7}
    submission = Submission.objects.get(job=job)
    assert submission.anomalies == []
    assert set(submission.entries.values_list("outcome", flat=True)) == {"returned"}
    assert sorted(
        GeneratedVersion.objects.filter(item__job=job).values_list("custom_id", flat=True)
    ) == sorted(SubmissionItem.objects.filter(item__job=job).values_list("custom_id", flat=True))
    for item in Item.objects.filter(job=job):
        story = list(Event.objects.filter(item=item).order_by("id").values_list("to_state", flat=True))
        assert story == ["submitted", "returned", "awaiting_review"]
    assert_paid_once(emulator, job)
    assert submission.state == SubmissionState.COLLECTED


def test_each_task_records_one_chunk_then_hands_over_and_the_last_one_finishes(emulator, settings):  # noqa: F811
    settings.BATCHDESK_COLLECT_CHUNK = 2
    job = job_with_items(BY_NAME["emulator"], 5, unit_size=5)
    [submission_id] = plan_submissions(job.pk)
    send_submission(submission_id)
    provider = get_provider("emulator")
    while observe_submission(submission_id, provider=provider) != "ended":
        time.sleep(0.05)

    outcomes, recorded = [], []
    for _ in range(5):
        outcomes.append(collect_submission(submission_id, seconds=0))
        recorded.append(SubmissionItem.objects.filter(item__job=job).exclude(outcome="").count())

    # Each task records a chunk and releases the submission, still ended, for the next.
    assert outcomes == ["continues", "continues", "collected", "not claimable", "not claimable"]
    assert recorded == [2, 4, 5, 5, 5]
    assert GeneratedVersion.objects.filter(item__job=job).count() == 5


class ChunkSizesNoted(Chunk):
    """Records as `Chunk` does, and notes how many lines each chunk it records holds."""

    sizes: list[int] = []

    def record(self) -> None:
        if self.parts:
            ChunkSizesNoted.sizes.append(self.lines)
        super().record()


def chunk_sizes_collecting(items: int) -> tuple[Job, list[int]]:
    """A job of `items` items sent in one unit and collected as a deployment collects it (recording
    threads on PostgreSQL, no transaction around it); the job and the lines of each chunk recorded."""
    job = job_with_items(BY_NAME["emulator"], items, unit_size=items)
    [submission_id] = plan_submissions(job.pk)
    send_submission(submission_id)
    provider = get_provider("emulator")
    while observe_submission(submission_id, provider=provider) != "ended":
        time.sleep(0.05)
    ChunkSizesNoted.sizes = []
    assert collect_submission(submission_id, provider=provider, chunk=ChunkSizesNoted) == "collected"
    return job, ChunkSizesNoted.sizes


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
def test_recorders_start_on_a_small_chunk_and_end_on_small_ones(emulator, settings):  # noqa: F811
    # The first chunk is a fifth of a full one, so that recording starts early, and the last ones
    # shrink as the lines expected run out, so that little is left to record once the reading ends.
    settings.BATCHDESK_COLLECT_CHUNK = 100

    job, sizes = chunk_sizes_collecting(430)

    assert sizes == [20, 100, 100, 100, 55, 27, 20, 8]
    assert Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).count() == 430
    assert GeneratedVersion.objects.filter(item__job=job).count() == 430


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_chunk_set_smaller_than_a_ramp_is_kept_as_set(emulator, settings):  # noqa: F811
    # A deployment committing every few lines gets exactly that, from the first chunk to the last.
    settings.BATCHDESK_COLLECT_CHUNK = 5

    _, sizes = chunk_sizes_collecting(23)

    assert sizes == [5, 5, 5, 5, 3]
