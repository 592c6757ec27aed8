"""The acceptance drill's collections, run by the workers (`ledger.pilots.drill` plans the drill and
keeps what each step showed): a unit's collection killed mid-chunk, and a unit's results delivered
and collected a second time."""

from django.db import transaction
from django.utils import timezone

from ..models import Submission
from ..pilots.drill import (
    DRILL_CHUNK_LINES,
    KILLED_CHUNK,
    note_interruption,
    note_repeated_delivery,
    unit_item_events,
    unit_ledger,
    unit_recorded,
    unit_versions,
)
from .collecting import Chunk, collect_again, collect_submission


class WorkerKilled(BaseException):
    """What the drill's collection dies of, between writing a chunk and committing it. Not an
    `Exception`: a killed worker handles nothing on its way out (its failure is not counted on the
    unit, its claim is not handed back); only the drill catches it."""

    def __init__(self, lines: int, versions: int, events: int):
        super().__init__(f"killed with {lines} line(s) written and not committed")
        self.lines, self.versions, self.events = lines, versions, events


class KilledMidChunk(Chunk):
    """The drill's way of recording a unit: a line a chunk, each committed by itself; the KILLED_CHUNK-th
    (the first, in a unit of one request) is written (its drafts, events, states) and rolled back before
    its commit, as when the worker recording it is killed."""

    def __init__(self, submission: Submission, *, size: int, overlap: bool):
        super().__init__(submission, size=DRILL_CHUNK_LINES, overlap=False)
        self.committed = 0
        self.dies_at = min(KILLED_CHUNK, submission.requests_sent or 1)

    def record(self) -> None:
        if not self.parts:
            return
        if self.committed + 1 < self.dies_at:
            super().record()
            self.committed += 1
            return
        lines, unit = self.lines, self.submission.pk
        with transaction.atomic():
            versions, events = unit_versions(unit).count(), unit_item_events(unit).count()
            super().record()
            raise WorkerKilled(
                lines,
                versions=unit_versions(unit).count() - versions,
                events=unit_item_events(unit).count() - events,
            )


def collect_interrupted(submission_id: int, *, provider=None) -> str:
    """The drill's collection of its unit: killed mid-chunk, its claim left to run out; the collector's
    pass gives the unit to another worker once it has (`collect_submission`), which records the rest."""
    try:
        outcome = collect_submission(submission_id, provider=provider, chunk=KilledMidChunk)
    except WorkerKilled as killed:
        unit = Submission.objects.get(pk=submission_id)
        note_interruption(
            submission_id,
            {
                "killed": True,
                "provider_ref": unit.provider_ref,
                "before_the_kill": unit_recorded(submission_id),
                "lost_with_the_worker": {
                    "lines": killed.lines,
                    "versions_written": killed.versions,
                    "events_written": killed.events,
                },
                "claim_left_until": unit.claimed_until.isoformat() if unit.claimed_until else None,
                "killed_at": timezone.now().isoformat(),
            },
        )
        return "killed mid-chunk by the acceptance drill"
    if outcome == "collected":  # its results ended within the first chunk: nothing left to lose
        note_interruption(submission_id, {"killed": False, "before_the_kill": unit_recorded(submission_id)})
    return outcome


class OfferedLines(Chunk):
    """Records as `Chunk` does, and counts the lines it was offered: the repeated delivery's evidence
    that it read the results again, not merely that it changed nothing."""

    def __init__(self, submission: Submission, *, size: int, overlap: bool):
        super().__init__(submission, size=size, overlap=overlap)
        self.offered = 0

    def add(self, part) -> None:
        if not isinstance(part, dict):  # a line of the results, not an anomaly already worded
            self.offered += 1
        super().add(part)


def deliver_again(submission_id: int, *, provider=None, held: str = "") -> str:
    """The drill's repeated delivery: the collected unit's results collected once more, and what the
    ledger held of the unit before and after."""
    before = unit_ledger(submission_id)
    chunks: list[OfferedLines] = []

    def counted(submission: Submission, **how) -> OfferedLines:
        chunks.append(OfferedLines(submission, **how))
        return chunks[-1]

    outcome = collect_again(submission_id, provider=provider, held=held, chunk=counted)
    if outcome == "collected again":
        note_repeated_delivery(
            submission_id,
            before=before,
            after=unit_ledger(submission_id),
            lines_offered=sum(chunk.offered for chunk in chunks),
        )
    return outcome
