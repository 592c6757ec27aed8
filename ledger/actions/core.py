"""How an item's state changes: one row at a time or many, always through the transition table,
with an event in the same transaction; and the job's state, derived from its items'."""

from collections.abc import Iterable
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..database.setwise import among, ids_query, insert_from_select
from ..models import Event, Item, ItemTally, Job
from ..notices.notifications import job_state_changed, pilot_report_checked
from ..states import (
    ALLOWED_TRANSITIONS,
    OPERATOR_STATES,
    OUTSTANDING_STATES,
    REVIEW_STATES,
    ItemState,
    JobState,
)


class NotAllowed(Exception):
    """The change asked for is not allowed in the current state. Nothing was changed."""


def enqueue(func: str, *args) -> None:
    """Queue background work once the current transaction has committed. The queue is a wake-up
    call: a broker that cannot take the task (Redis down) is logged, and what was committed stands
    (an API call still answers 202); the collector's pass finds the work in the ledger."""
    from django_q.tasks import async_task

    transaction.on_commit(lambda: async_task(func, *args), robust=True)


def actor_name(actor) -> str:
    return actor.get_username() if actor is not None else "system"


def change_state(
    item_id: int,
    *,
    to: str,
    actor=None,
    reason: str = "",
    code: str = "",
    data: dict | None = None,
    expect: Iterable[str] | None = None,
    **fields,
) -> Item:
    """Move one item to `to`, if the transition table allows it from the state it is in now.

    The row is locked for the change, so two workers cannot both make it. `expect` narrows
    the states the caller is prepared to move from. Raises NotAllowed and changes nothing
    otherwise.
    """
    with transaction.atomic():
        item = Item.objects.select_for_update().get(pk=item_id)
        if (expect is not None and item.state not in set(expect)) or to not in ALLOWED_TRANSITIONS[
            item.state
        ]:
            raise NotAllowed(
                f"Item {item_id} is {ItemState(item.state).label.lower()} ({item.state}); "
                f"it cannot become {to}"
            )
        from_state = item.state
        now = timezone.now()
        Item.objects.filter(pk=item.pk, state=from_state).update(
            state=to, reason=reason, reason_code=code, updated_at=now, **fields
        )
        Event.objects.create(
            item=item,
            job_id=item.job_id,
            from_state=from_state,
            to_state=to,
            actor=actor,
            actor_name=actor_name(actor),
            reason=reason,
            data=data or {},
        )
        item.refresh_from_db()
    return item


def move_items(
    item_ids: Iterable[int],
    *,
    from_state: str,
    to: str,
    reason: str = "",
    code: str = "",
    actor=None,
    data=None,
    **fields,
) -> list[int]:
    """Move many items that are all in `from_state`; those that are not are left alone."""
    if to not in ALLOWED_TRANSITIONS[from_state]:
        raise NotAllowed(f"{from_state} cannot become {to}")
    with transaction.atomic():
        # The ids go to the database as one parameter each time, not one placeholder an id.
        ids = list(
            Item.objects.select_for_update()
            .filter(among("pk", item_ids), state=from_state)
            .values_list("pk", flat=True)
        )
        if not ids:
            return []
        moved = ids_query(ids)
        Item.objects.filter(among("pk", ids)).update(
            state=to, reason=reason, reason_code=code, updated_at=timezone.now(), **fields
        )
        # Each item's event written by the database from the item's row, in the items' order: a
        # unit's thousands of items pass through Python as their ids only.
        insert_from_select(
            Event,
            select={"item": "id", "job": "job_id"},
            values={
                "from_state": from_state,
                "to_state": to,
                "reason": reason,
                "actor": actor,
                "actor_name": actor_name(actor),
                "data": data or {},
            },
            from_sql=f"{Item._meta.db_table} WHERE id IN ({moved.sql}) ORDER BY id",
            params=moved.params,
        )
    return ids


# A job's tally rows are folded into one per state once there are more than this (each change of
# item states appends a few): reading them stays a sum over a few dozen rows.
COMPACT_AFTER_ROWS = 100


def refresh_job_state(job_id: int) -> str:
    """Derive the job's state from its items' states (SPEC §2): results outstanding, running (preparing
    before its first unit); else drafts with a reviewer or on their way to the destination, in review;
    else items waiting for an operator, needs attention; else completed. A cancelled job stays so."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state == JobState.CANCELLED:
            return job.state
        tallies = ItemTally.objects.filter(job=job)
        if tallies.count() > COMPACT_AFTER_ROWS:
            ItemTally.objects.compact(job.pk)
        states = set(tallies.counts_by_state())
        if job.state == JobState.PAUSED and ItemState.PREPARED in states:
            return job.state  # nothing new is sent until someone acts (a budget, a billing refusal)
        if states & OUTSTANDING_STATES:
            new = JobState.PREPARING if not job.submissions.exists() else JobState.RUNNING
        elif states & REVIEW_STATES:
            new = JobState.IN_REVIEW
        elif states & set(OPERATOR_STATES):
            # Nothing in flight, nothing for a reviewer: what is left waits for an operator.
            new = JobState.NEEDS_ATTENTION
        else:
            new = JobState.COMPLETED
        if new != job.state:
            Job.objects.filter(pk=job.pk).update(state=new, updated_at=timezone.now())
            Event.objects.create(job=job, from_state=job.state, to_state=new, reason="item states changed")
            job_state_changed(job, new)
        pilot_report_checked(job, new)
    return new


def backoff(failures: int, retry_after: float | None = None) -> timedelta:
    """Doubling wait from BATCHDESK_RETRY_BASE_SECONDS, at most an hour, never less than Retry-After."""
    delay = timedelta(seconds=min(settings.BATCHDESK_RETRY_BASE_SECONDS * 2 ** (failures - 1), 3600))
    if retry_after:
        delay = max(delay, timedelta(seconds=retry_after))
    return delay
