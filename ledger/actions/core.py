"""How an item's state changes: one row at a time or many, always through the transition table,
with an event in the same transaction."""

from collections.abc import Iterable
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_q.tasks import async_task

from ..database.setwise import among, ids_query, insert_from_select
from ..models import Event, Item
from ..states import (
    ALLOWED_TRANSITIONS,
    ItemState,
)


class NotAllowed(Exception):
    """The change asked for is not allowed in the current state. Nothing was changed."""


def enqueue(func: str, *args) -> None:
    """Queue background work once the current transaction has committed. The queue is a wake-up
    call: a broker that cannot take the task (Redis down) is logged, and what was committed stands
    (an API call still answers 202); the collector's pass finds the work in the ledger."""
    transaction.on_commit(lambda: async_task(func, *args), robust=True)


def actor_name(actor) -> str:
    return actor.get_username() if actor is not None else "system"


def write_event(
    *, from_state: str, to: str, actor=None, reason: str = "", data: dict | None = None, **subject
) -> Event:
    """The event of one change of state (rule 9), in the caller's transaction. `subject` names what
    changed: an `item` (and its `job_id`), or a `job`."""
    return Event.objects.create(
        **subject,
        from_state=from_state,
        to_state=to,
        actor=actor,
        actor_name=actor_name(actor),
        reason=reason,
        data=data or {},
    )


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
        write_event(
            item=item, job_id=item.job_id, from_state=from_state, to=to, actor=actor, reason=reason, data=data
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


def backoff(failures: int, retry_after: float | None = None) -> timedelta:
    """Doubling wait from BATCHDESK_RETRY_BASE_SECONDS, at most an hour, never less than Retry-After."""
    delay = timedelta(seconds=min(settings.BATCHDESK_RETRY_BASE_SECONDS * 2 ** (failures - 1), 3600))
    if retry_after:
        delay = max(delay, timedelta(seconds=retry_after))
    return delay
