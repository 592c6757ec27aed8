"""The acceptance drill (SPEC §6 `drill`, issue 19 point 2): three faults staged in a pilot's own run,
in the real workers, against the job's own provider and destination. Each is a `DrillStep`, planned
with the pilot, its unit or item taken when the run reaches it (a compare-and-set: two workers never
drill two), and done with what the ledger showed at that moment.

- Interrupted collection: the first unit of the pilot's job to come to collection with two requests
  or more (one, where the job's units or sample are of one). Its first collection records a line a
  chunk; its second chunk (its first, in a unit of one request) is written and dies before its
  commit, as under a worker killed mid-chunk, and its claim is left to run out
  (BATCHDESK_LEASE_SECONDS); the collector's next pass gives the unit to a worker that collects the
  rest (`ledger.actions.drilling`).
- Repeated delivery: once that unit is collected, the collector's pass queues its results to be
  collected again, whole, by the same collection: the same results delivered twice. Every line is
  offered to the recorder again; nothing may change (rule 4). A provider cannot be made to deliver a
  unit twice, so every provider is drilled this way, the emulator too.
- Destination timeout: the pilot's first approved draft to be applied. Its first attempt reaches the
  destination (the catalogue publishes; a webhook is sent the request) and the answer is lost, as when
  a call times out after the destination acted. The attempt counts as timed out; the retry carries
  the same operation key and must not publish again (rule 7).

Nothing here is chosen by the seed: the units and the approvals do not exist when the sample is drawn,
so each step takes the first the run offers, and records which. A job whose pilot did not ask for the
drill has no steps, and each hook is one statement that finds none. The report's checks
(`drill_report`) are read from the ledger, not from these notes.
"""

from datetime import datetime

from django.db import transaction
from django.db.models import Count, Max
from django.utils import timezone

from ..models import (
    DestinationAttempt,
    DrillKind,
    DrillStep,
    Event,
    GeneratedVersion,
    Item,
    Pilot,
    Publication,
    Submission,
    SubmissionItem,
    UnitCharge,
)
from ..states import SubmissionState

# The interrupted collection records this many lines a chunk, so that it stops part-way through even
# a unit of two requests.
DRILL_CHUNK_LINES = 1
# The chunk the interrupted collection dies in: the second, so that one is recorded before the kill
# and the rest after it (the first, in a unit of one request).
KILLED_CHUNK = 2

LOST_ANSWER = (
    "No answer (the acceptance drill lost it after the destination had the request, as a timeout "
    "does); will retry with the same key"
)


def plan_drill(pilot: Pilot) -> None:
    """The drill's steps, planned with a pilot that asks for it (in `create_job`'s transaction)."""
    DrillStep.objects.bulk_create(DrillStep(pilot=pilot, kind=kind) for kind in DrillKind.values)


# --- interrupted collection ----------------------------------------------------------------------


def unit_to_interrupt(submission_id: int) -> bool:
    """Whether collecting this unit is the drill's interrupted collection: the unit the drill took and
    has not interrupted yet, or, while it has taken none, this one if it has KILLED_CHUNK requests or
    more, or as many as the job's units or items can have (taken now, and chosen for the repeated
    delivery too)."""
    found = (
        DrillStep.objects.filter(
            kind=DrillKind.INTERRUPTED_COLLECTION,
            done_at__isnull=True,
            pilot__job__submissions__pk=submission_id,
        )
        .values_list("pk", "pilot_id", "submission_id")
        .first()
    )
    if found is None:
        return False
    step_id, pilot_id, taken = found
    if taken is not None:
        return taken == submission_id
    requests, unit_size, job_id = Submission.objects.values_list(
        "requests_sent", "job__unit_size", "job_id"
    ).get(pk=submission_id)
    if (requests or 0) < min(KILLED_CHUNK, unit_size, Item.objects.filter(job_id=job_id).count()):
        return False
    now = timezone.now()
    with transaction.atomic():
        won = DrillStep.objects.filter(pk=step_id, submission__isnull=True).update(
            submission_id=submission_id, taken_at=now
        )
        if won:
            DrillStep.objects.filter(
                pilot_id=pilot_id, kind=DrillKind.REPEATED_DELIVERY, submission__isnull=True
            ).update(submission_id=submission_id, taken_at=now)
    return won == 1


def note_interruption(submission_id: int, evidence: dict) -> None:
    """The drill's interrupted collection has happened (or, `evidence["killed"]` false, its unit was
    collected whole in one chunk after all)."""
    DrillStep.objects.filter(
        kind=DrillKind.INTERRUPTED_COLLECTION, submission_id=submission_id, done_at__isnull=True
    ).update(done_at=timezone.now(), evidence=evidence)


def unit_recorded(submission_id: int) -> dict:
    """What the ledger holds of a unit's results now: its requests recorded and its drafts."""
    entries = SubmissionItem.objects.filter(submission_id=submission_id)
    return {
        "requests": entries.count(),
        "recorded": entries.exclude(outcome="").count(),
        "versions": sorted(unit_versions(submission_id).values_list("pk", flat=True)),
    }


def unit_versions(submission_id: int):
    """The drafts answering the unit's requests, found by their custom_ids (versions are not indexed by
    their unit)."""
    custom_ids = SubmissionItem.objects.filter(submission_id=submission_id).values("custom_id")
    return GeneratedVersion.objects.filter(custom_id__in=custom_ids)


def unit_item_events(submission_id: int):
    items = SubmissionItem.objects.filter(submission_id=submission_id).values("item_id")
    return Event.objects.filter(item_id__in=items)


# --- repeated delivery ---------------------------------------------------------------------------


def repeated_deliveries_due() -> list[int]:
    """Units whose results the drill delivers again: taken for it, collected, not yet delivered again."""
    return list(
        DrillStep.objects.filter(
            kind=DrillKind.REPEATED_DELIVERY,
            done_at__isnull=True,
            submission__state=SubmissionState.COLLECTED,
        ).values_list("submission_id", flat=True)
    )


def unit_ledger(submission_id: int) -> dict:
    """Every ledger entry a unit's collection writes, as it stands: what a second delivery of its
    results must leave as it is."""
    charge = UnitCharge.objects.filter(submission_id=submission_id).first()
    events = unit_item_events(submission_id).aggregate(count=Count("pk"), last=Max("pk"))
    unit = Submission.objects.get(pk=submission_id)
    outcomes = (
        SubmissionItem.objects.filter(submission_id=submission_id)
        .order_by()
        .values_list("outcome")
        .annotate(n=Count("pk"))
    )
    return {
        "versions": [
            list(row) for row in unit_versions(submission_id).order_by("pk").values_list("pk", "content_hash")
        ],
        "item_events": events["count"],
        "last_item_event": events["last"],
        "unit_events": Event.objects.filter(submission_id=submission_id).count(),
        "requests_by_outcome": dict(sorted(outcomes)),
        "state": unit.state,
        "anomalies": len(unit.anomalies),
        "charge": None
        if charge is None
        else {
            "id": charge.pk,
            "input_tokens": charge.input_tokens,
            "output_tokens": charge.output_tokens,
            "cost_usd": str(charge.cost_usd) if charge.cost_usd is not None else None,
            "settled_at": _when(charge.settled_at),
        },
    }


def note_repeated_delivery(submission_id: int, *, before: dict, after: dict, lines_offered: int) -> None:
    """The drill's repeated delivery has happened: `lines_offered` lines of the unit's results were
    read again and offered to the recorder; `changed` names what of `unit_ledger` they changed."""
    changed = sorted(key for key in before if before[key] != after.get(key))
    evidence = {"lines_offered": lines_offered, "before": before, "after": after, "changed": changed}
    DrillStep.objects.filter(
        kind=DrillKind.REPEATED_DELIVERY, submission_id=submission_id, done_at__isnull=True
    ).update(done_at=timezone.now(), evidence=evidence)


# --- destination timeout -------------------------------------------------------------------------


def answer_lost(item: Item, operation_key: str) -> bool:
    """Whether the drill loses the answer to the attempt under `operation_key`, which the destination
    has just applied: the first attempt of the first item of a drilling pilot's job to reach its
    destination (taken now). Asked by `destinations.drilling.DrillingDestination` alone, which wraps
    a drilling pilot's destination."""
    step_id = (
        DrillStep.objects.filter(
            kind=DrillKind.DESTINATION_TIMEOUT, item__isnull=True, pilot__job_id=item.job_id
        )
        .values_list("pk", flat=True)
        .first()
    )
    if step_id is None:
        return False
    attempts = list(DestinationAttempt.objects.filter(item=item).values_list("pk", "destination")[:2])
    if len(attempts) != 1:  # the item's first attempt only
        return False
    [(attempt_id, destination)] = attempts
    now = timezone.now()
    evidence = {
        "attempt": attempt_id,
        "operation_key": operation_key,
        "destination": destination,
        "publications": list(
            Publication.objects.filter(operation_key=operation_key).values_list("pk", flat=True)
        ),
    }
    won = DrillStep.objects.filter(pk=step_id, item__isnull=True).update(
        item=item, taken_at=now, done_at=now, evidence=evidence
    )
    return won == 1


def _when(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None
