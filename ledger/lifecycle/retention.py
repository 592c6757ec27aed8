"""Retention of unusable drafts (SPEC §11): the text of a draft nobody can use any more is kept for
BATCHDESK_RETAIN_UNUSABLE_DAYS, then erased. Its hash, length, usage, cost, validation reasons and
events stay, and its item gets an event saying so. Approved and applied text is never touched.

A draft's age is counted from when it became unusable, not from when it was written: a draft that
waited 100 days for a reviewer and was rejected today keeps its text for the whole period from
today. So a draft is unusable since
- it failed validation: when it was written (it never was usable);
- a later draft of its item arrived (superseded): when that one was written;
- its item was rejected, made obsolete, withdrawn or cancelled (its latest draft): when the item
  reached that state (`Item.updated_at`: nothing changes an item in those states but a new state).

The pass goes through the drafts in item order, a few thousand at a time, each batch one
transaction: the drafts' rows are locked and rechecked, their text erased by one UPDATE, and each
item's event written by one INSERT … SELECT. Only ids pass through Python, so its memory does not
grow with the number of drafts; a draft already erased (by an earlier or a concurrent pass) is left
alone, so no event is written twice."""

import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.core import checks
from django.db import models, transaction
from django.db.models import Case, Exists, F, OuterRef, Q, QuerySet, Subquery, Value, When
from django.db.models.functions import Length
from django.utils import timezone

from ..database.setwise import among, ids_query, insert_from_select
from ..models import Approval, DestinationAttempt, Event, GeneratedVersion, Item, Product, Publication
from ..states import ItemState

# Drafts are erased a batch at a time: about this many a statement (an item's drafts are never split).
VERSIONS_PER_BATCH = 5_000

# An item in one of these states still needs its drafts: one waits for a reviewer, or was approved
# and is (being) published. None of its drafts is erased, whatever its age.
KEPT_ITEM_STATES = (ItemState.AWAITING_REVIEW, ItemState.APPROVED, ItemState.APPLYING, ItemState.APPLIED)

# What an item's retention event says in `to_state`: the item stays in its state (`from_state`), and
# every reader that counts items reaching a state (the audit's rejections, the quality page, a
# pilot's measures) reads past it.
CONTENT_EXPIRED = "content_expired"

# An item in one of these states will never use its latest draft.
UNUSABLE_ITEM_STATES = (ItemState.REJECTED, ItemState.OBSOLETE, ItemState.WITHDRAWN, ItemState.CANCELLED)


class Unusable(models.TextChoices):
    """Why a draft could be erased, as the pass reports it."""

    VALIDATION_FAILED = "validation_failed", "Failed validation"
    SUPERSEDED = "superseded", "Superseded by a later draft"
    REJECTED = ItemState.REJECTED.value, "Rejected"
    OBSOLETE = ItemState.OBSOLETE.value, "Obsolete"
    WITHDRAWN = ItemState.WITHDRAWN.value, "Withdrawn"
    CANCELLED = ItemState.CANCELLED.value, "Cancelled"


# --- the setting ---------------------------------------------------------------------------


def retain_unusable_days() -> int:
    """BATCHDESK_RETAIN_UNUSABLE_DAYS as a whole number of days; ValueError, worded for the person
    who set it, when it is not a positive whole number (the system check refuses it at startup)."""
    value = getattr(settings, "BATCHDESK_RETAIN_UNUSABLE_DAYS", 90)
    try:
        days = int(str(value).strip())
    except ValueError:
        raise ValueError(
            f"BATCHDESK_RETAIN_UNUSABLE_DAYS {value!r} is not a whole number of days, such as 90"
        ) from None
    if days < 1:
        raise ValueError(
            f"BATCHDESK_RETAIN_UNUSABLE_DAYS {value!r} would erase unusable drafts the day they are "
            "written: it must be at least 1"
        )
    return days


def check_retention_setting(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """System check: a retention period that is not a positive whole number of days stops the web
    server and the workers at startup, before any pass could erase what it should have kept."""
    try:
        retain_unusable_days()
    except ValueError as exc:
        return [
            checks.Error(str(exc), hint="Set it to a number of days, or unset it (90).", id="batchdesk.E004")
        ]
    return []


# --- which drafts ----------------------------------------------------------------------------


def erasable(cutoff: datetime) -> QuerySet[GeneratedVersion]:
    """Drafts whose text may be erased: still held, unusable since before `cutoff`, of an item that
    no longer needs them, and named by nothing that was approved, sent or published. Each is
    annotated with why it is unusable (`unusable`, an `Unusable` value)."""
    later = GeneratedVersion.objects.filter(item=OuterRef("item"), number__gt=OuterRef("number"))
    named = Q(
        Exists(Approval.objects.filter(version=OuterRef("pk")))
        | Exists(DestinationAttempt.objects.filter(version=OuterRef("pk")))
        | Exists(Publication.objects.filter(version=OuterRef("pk")))
        | Exists(Product.objects.filter(published_version=OuterRef("pk")))
        | Exists(Item.objects.filter(approved_version=OuterRef("pk")))
    )
    return (
        GeneratedVersion.objects.filter(content_expired_at__isnull=True, created_at__lt=cutoff)
        .exclude(item__state__in=KEPT_ITEM_STATES)
        .annotate(superseded_at=Subquery(later.order_by("number").values("created_at")[:1]))
        .filter(
            Q(valid=False)
            | Q(superseded_at__lt=cutoff)
            | Q(item__state__in=UNUSABLE_ITEM_STATES, item__updated_at__lt=cutoff)
        )
        .exclude(named)
        .annotate(
            unusable=Case(
                When(valid=False, then=Value(Unusable.VALIDATION_FAILED.value)),
                When(superseded_at__isnull=False, then=Value(Unusable.SUPERSEDED.value)),
                default=F("item__state"),
                output_field=models.CharField(),
            )
        )
        .order_by()
    )


def cutoff_for(now: datetime) -> datetime:
    return now - timedelta(days=retain_unusable_days())


def erasable_counts(now: datetime | None = None) -> dict[str, int]:
    """What a pass would erase now, by why each draft is unusable: a dry run, which changes nothing."""
    rows = erasable(cutoff_for(now or timezone.now())).values_list("unusable").annotate(n=models.Count("id"))
    return dict(rows)


# --- the pass --------------------------------------------------------------------------------


@dataclass
class RetentionPass:
    """What one pass erased: drafts by why they were unusable, and the items given an event.
    `last_item`: the pass went through the drafts of items up to this id (`finished`: all)."""

    erased: Counter = field(default_factory=Counter)
    items: int = 0
    last_item: int = 0
    finished: bool = False

    @property
    def drafts(self) -> int:
        return sum(self.erased.values())


def apply_retention(
    *, now: datetime | None = None, after_item: int = 0, until: float | None = None, stop=lambda: False
) -> RetentionPass:
    """Erase the text of every erasable draft (see `erasable`) of the items after `after_item`, one
    batch at a time; after `until` (time.monotonic()) or once `stop()` says so, it ends between two
    batches, and a later pass goes on from `last_item`. Safe to run twice and side by side."""
    now = now or timezone.now()
    cutoff = cutoff_for(now)
    done = RetentionPass(last_item=after_item)
    while True:
        end = batch_end(done.last_item)
        erased, items = erase_batch(cutoff=cutoff, now=now, after_item=done.last_item, up_to_item=end)
        done.erased.update(erased)
        done.items += items
        if end is None:
            done.finished = True
            return done
        done.last_item = end
        if (until is not None and time.monotonic() > until) or stop():
            return done


def batch_end(after_item: int) -> int | None:
    """The item whose drafts bring the batch after `after_item` to VERSIONS_PER_BATCH (read from
    the drafts' (item, number) index); None when fewer are left."""
    ends = (
        GeneratedVersion.objects.filter(item_id__gt=after_item)
        .order_by("item_id")
        .values_list("item_id", flat=True)
    )
    found = list(ends[VERSIONS_PER_BATCH - 1 : VERSIONS_PER_BATCH])
    return found[0] if found else None


def erase_batch(
    *, cutoff: datetime, now: datetime, after_item: int, up_to_item: int | None
) -> tuple[Counter, int]:
    """One transaction: the items in (after_item, up_to_item] with erasable drafts locked, then those
    drafts (a draft a concurrent pass erased, or an approval made, meanwhile drops out when
    rechecked), their text erased, an event for each of their items. Returns the drafts erased by why, and how many items."""
    drafts = erasable(cutoff).filter(item_id__gt=after_item)
    if up_to_item is not None:
        drafts = drafts.filter(item_id__lte=up_to_item)
    days = retain_unusable_days()
    with transaction.atomic():
        # The items first, in id order, as approving locks its item: an owner's approval of an
        # unusable draft (a repair) in flight is waited for, and the drafts chosen next see it.
        list(
            Item.objects.select_for_update()
            .filter(pk__in=drafts.values("item_id"))
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        rows = list(drafts.select_for_update(of=("self",)).values_list("pk", "unusable"))
        if not rows:
            return Counter(), 0
        ids = [pk for pk, _ in rows]
        GeneratedVersion.objects.filter(among("pk", ids)).update(
            content_length=Length("content"), content="", raw_output="", content_expired_at=now
        )
        erased = ids_query(ids)
        items = insert_from_select(
            Event,
            select={"item": "id", "job": "job_id", "from_state": "state"},
            values={
                "to_state": CONTENT_EXPIRED,
                "reason": (
                    f"The text of its unusable drafts was erased after {days} days (retention); "
                    "their hashes, lengths, usage, cost and reasons are kept"
                ),
                "data": {"content_expired_at": now.isoformat(), "retain_unusable_days": days},
            },
            from_sql=(
                f"{Item._meta.db_table} WHERE id IN (SELECT item_id FROM "
                f"{GeneratedVersion._meta.db_table} WHERE id IN ({erased.sql})) ORDER BY id"
            ),
            params=erased.params,
        )
    return Counter(unusable for _, unusable in rows), items
