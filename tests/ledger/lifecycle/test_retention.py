"""Retention of unusable drafts (SPEC §11, ledger/lifecycle/retention.py): which drafts lose their text and
when, what they keep, the event, and a pass that is safe to repeat, to run beside another and to
stop between batches."""

import threading
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import override_settings
from django.utils import timezone

from ledger.actions.applying import apply_item
from ledger.actions.core import change_state
from ledger.actions.reviewing import approve_version, reject_version
from ledger.lifecycle import retention
from ledger.lifecycle.retention import apply_retention, erasable_counts
from ledger.models import Event, GeneratedVersion, Item, ItemTally, Product
from ledger.states import ItemState
from tests.factories import ItemFactory, UserFactory, add_version

pytestmark = pytest.mark.django_db

S = ItemState
LONG_AGO = timedelta(days=91)


def aged(version: GeneratedVersion, by: timedelta = LONG_AGO) -> GeneratedVersion:
    """The draft written `by` ago."""
    GeneratedVersion.objects.filter(pk=version.pk).update(created_at=timezone.now() - by)
    version.refresh_from_db()
    return version


def settled(item: Item, by: timedelta = LONG_AGO) -> None:
    """The item reached its state `by` ago."""
    Item.objects.filter(pk=item.pk).update(updated_at=timezone.now() - by)


def old_draft(state: str, *, valid: bool = True, text: str = "") -> GeneratedVersion:
    """An item in `state` whose only draft was written, and whose state was reached, long ago."""
    item = ItemFactory(state=state)
    version = aged(add_version(item, text, valid=valid, reasons=None if valid else ["Too short"]))
    settled(item)
    return version


def erased_events(item: Item) -> list[Event]:
    return list(Event.objects.filter(item=item, data__has_key="content_expired_at"))


def test_each_kind_of_unusable_draft_loses_its_text_and_keeps_the_rest():
    invalid = old_draft(S.VALIDATION_FAILED, valid=False, text="Short, but kept as evidence for a while")
    rejected = old_draft(S.REJECTED)
    obsolete = old_draft(S.OBSOLETE)
    withdrawn = old_draft(S.WITHDRAWN)
    cancelled = old_draft(S.CANCELLED)
    # Superseded: an item's first draft, long after its second arrived (the item is not kept).
    superseded = aged(
        add_version(rejected.item, "An earlier draft, replaced by the one rejected"), LONG_AGO * 2
    )
    GeneratedVersion.objects.filter(pk=superseded.pk).update(number=0)
    before = {v.pk: v for v in GeneratedVersion.objects.all()}

    done = apply_retention()

    assert done.finished and done.items == 5 and done.drafts == 6
    assert dict(done.erased) == {
        "validation_failed": 1,
        "superseded": 1,
        "rejected": 1,
        "obsolete": 1,
        "withdrawn": 1,
        "cancelled": 1,
    }
    for version in GeneratedVersion.objects.all():
        was = before[version.pk]
        assert (version.content, version.raw_output) == ("", "")
        assert version.content_expired_at is not None
        assert version.content_length == len(was.content) == version.length
        assert (version.content_hash, version.input_tokens, version.output_tokens, version.usage) == (
            was.content_hash,
            was.input_tokens,
            was.output_tokens,
            was.usage,
        )
        assert version.validation_reasons == was.validation_reasons
    assert GeneratedVersion.objects.get(pk=invalid.pk).validation_reasons == ["Too short"]
    # One event per item, in its state, saying what happened; the item itself stays where it was.
    for version in (invalid, rejected, obsolete, withdrawn, cancelled):
        item = Item.objects.get(pk=version.item_id)
        [event] = erased_events(item)
        assert (event.from_state, event.to_state) == (item.state, "content_expired")
        assert event.actor_name == "system" and event.job_id == item.job_id
        assert "erased after 90 days" in event.reason


def test_drafts_unusable_for_less_than_the_period_are_kept():
    # Written 100 days ago, rejected today: unusable for a day, not for 100.
    owner = UserFactory(roles=["catalogue_owner"])
    item = ItemFactory(awaiting_review=True)
    waited = aged(add_version(item), timedelta(days=100))
    reject_version(item_id=item.pk, version_id=waited.pk, reviewer=owner, reason="Too bland")
    # Superseded only yesterday, though written long ago.
    other = ItemFactory(state=S.REJECTED)
    settled(other, timedelta(days=1))
    first = aged(add_version(other), timedelta(days=200))
    add_version(other)
    GeneratedVersion.objects.filter(item=other, number=2).update(
        created_at=timezone.now() - timedelta(days=1)
    )
    # Failed validation 89 days ago.
    young = old_draft(S.VALIDATION_FAILED, valid=False)
    aged(young, timedelta(days=89))

    assert apply_retention().drafts == 0
    assert erasable_counts() == {}
    for version in (waited, first, young):
        version.refresh_from_db()
        assert version.content and version.content_expired_at is None


@override_settings(BATCHDESK_RETAIN_UNUSABLE_DAYS="30")
def test_the_period_comes_from_the_setting():
    version = old_draft(S.OBSOLETE)
    aged(version, timedelta(days=31))
    settled(version.item, timedelta(days=31))
    assert apply_retention().drafts == 1
    assert "erased after 30 days" in erased_events(version.item)[0].reason


def test_approved_applied_and_reviewed_text_is_never_touched():
    owner = UserFactory(roles=["catalogue_owner"])
    # Applied by the built-in catalogue destination: its draft, the approval, the publication.
    applied_item = ItemFactory(awaiting_review=True)
    applied = add_version(applied_item)
    approve_version(
        item_id=applied_item.pk, version_id=applied.pk, version_hash=applied.content_hash, approver=owner
    )
    apply_item(applied_item.pk)
    applied_item.refresh_from_db()
    assert applied_item.state == S.APPLIED
    # Approved, then refused by the destination and cancelled: the item no longer needs its draft,
    # but an approval names it.
    refused_item = ItemFactory(awaiting_review=True)
    refused = add_version(refused_item)
    approve_version(
        item_id=refused_item.pk, version_id=refused.pk, version_hash=refused.content_hash, approver=owner
    )
    for step in (S.APPLYING, S.DESTINATION_REJECTED, S.CANCELLED):
        change_state(refused_item.pk, to=step)
    # Waiting for a reviewer, with an older draft that failed validation.
    waiting_item = ItemFactory(awaiting_review=True)
    earlier = add_version(waiting_item, valid=False)
    waiting = add_version(waiting_item)
    # A cancelled item's draft that the catalogue shows as published (put there by hand long ago).
    shown = old_draft(S.CANCELLED)
    Product.objects.filter(pk=shown.item.product_id).update(published_version=shown)
    for version in (applied, refused, earlier, waiting):
        aged(version)
    for item in (applied_item, refused_item, waiting_item):
        settled(item)
    texts = {v.pk: v.content for v in GeneratedVersion.objects.all()}

    assert apply_retention().drafts == 0

    assert {v.pk: v.content for v in GeneratedVersion.objects.all()} == texts
    assert not GeneratedVersion.objects.filter(content_expired_at__isnull=False).exists()
    applied_item.refresh_from_db()
    assert applied_item.approvals.get().final_content == applied.content
    assert applied_item.product.published_content == applied.content


def test_a_second_pass_erases_nothing_and_writes_no_event():
    version = old_draft(S.REJECTED)
    assert apply_retention().drafts == 1
    events = Event.objects.count()
    expired_at = GeneratedVersion.objects.get(pk=version.pk).content_expired_at

    again = apply_retention()

    assert (again.drafts, again.items) == (0, 0)
    assert Event.objects.count() == events
    assert GeneratedVersion.objects.get(pk=version.pk).content_expired_at == expired_at


def test_erasing_changes_no_tally():
    for state in (S.REJECTED, S.VALIDATION_FAILED):
        old_draft(state, valid=state != S.VALIDATION_FAILED)
    tallies = ItemTally.objects.count()
    assert apply_retention().drafts == 2
    assert ItemTally.objects.count() == tallies


def test_the_dry_run_says_what_would_go_and_changes_nothing():
    old_draft(S.REJECTED)
    old_draft(S.VALIDATION_FAILED, valid=False)
    events = Event.objects.count()
    out = StringIO()

    call_command("apply_retention", "--dry-run", stdout=out)

    assert "Would erase the text of 2 unusable drafts older than 90 days" in out.getvalue()
    assert "Rejected: 1" in out.getvalue() and "Failed validation: 1" in out.getvalue()
    assert Event.objects.count() == events
    assert not GeneratedVersion.objects.filter(content_expired_at__isnull=False).exists()

    out = StringIO()
    call_command("apply_retention", stdout=out)
    assert "Erased the text of 2 unusable drafts older than 90 days, of 2 items" in out.getvalue()
    assert GeneratedVersion.objects.filter(content_expired_at__isnull=False).count() == 2


def test_batches_never_split_an_item_and_a_stopped_pass_goes_on_where_it_stopped(monkeypatch):
    monkeypatch.setattr(retention, "VERSIONS_PER_BATCH", 2)
    items = []
    for _ in range(3):
        first = old_draft(S.REJECTED)
        for number in (2, 3):
            aged(add_version(first.item), LONG_AGO + timedelta(days=number))
        settled(first.item)
        items.append(first.item)

    stopped = apply_retention(stop=lambda: True)

    assert not stopped.finished and stopped.last_item == items[0].pk
    assert stopped.drafts == 3 and stopped.items == 1
    rest = apply_retention(after_item=stopped.last_item)
    assert rest.finished and rest.drafts == 6 and rest.items == 2
    for item in items:
        assert len(erased_events(item)) == 1
    assert not GeneratedVersion.objects.filter(content_expired_at__isnull=True).exists()


def a_pass_waiting_beside() -> tuple[threading.Thread, dict]:
    """A retention pass started in a thread of its own, returned once it waits for a lock this
    test's transaction holds (or has ended): join the thread, then read `result["done"]`."""
    result: dict = {}

    def run():
        try:
            result["done"] = apply_retention()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    with connection.cursor() as cursor:
        while thread.is_alive():
            # Activity is read once a transaction unless its snapshot is cleared.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            if cursor.fetchone()[0]:
                break
    return thread, result


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
def test_two_passes_at_once_erase_each_draft_and_write_each_event_once():
    versions = [old_draft(S.REJECTED) for _ in range(3)]
    with transaction.atomic():
        first = apply_retention()  # holds the drafts' rows until it commits
        thread, other = a_pass_waiting_beside()
    thread.join()

    assert first.drafts == 3 and other["done"].drafts == 0
    for version in versions:
        assert len(erased_events(version.item)) == 1


@pytest.mark.parametrize("value", ["0", "-5", "ninety", "1.5", ""])
def test_a_period_that_is_not_a_positive_whole_number_stops_startup(value):
    with override_settings(BATCHDESK_RETAIN_UNUSABLE_DAYS=value):
        [error] = retention.check_retention_setting()
    assert error.id == "batchdesk.E004" and "BATCHDESK_RETAIN_UNUSABLE_DAYS" in error.msg


def test_a_whole_number_of_days_passes_the_check():
    with override_settings(BATCHDESK_RETAIN_UNUSABLE_DAYS="365"):
        assert retention.check_retention_setting() == []


def test_the_task_hands_what_it_did_not_reach_to_a_task_of_its_own(monkeypatch):
    from ledger import tasks

    monkeypatch.setattr(retention, "VERSIONS_PER_BATCH", 1)
    monkeypatch.setattr(tasks, "TASK_SECONDS", -1)  # out of time after its first batch
    queued = []
    monkeypatch.setattr(tasks, "async_task", lambda func, *args: queued.append((func, *args)))
    first, second = old_draft(S.REJECTED), old_draft(S.OBSOLETE)

    tasks.apply_retention()

    assert queued == [("ledger.tasks.apply_retention", first.item_id)]
    assert GeneratedVersion.objects.filter(content_expired_at__isnull=False).count() == 1
    while queued:  # each task queued runs, as a worker would take it
        _, after = queued.pop()
        tasks.apply_retention(after)
    assert GeneratedVersion.objects.filter(content_expired_at__isnull=False).count() == 2
    assert len(erased_events(second.item)) == 1


def test_retention_events_are_not_taken_for_rejections_or_other_arrivals_in_a_state():
    rejected = old_draft(S.REJECTED)
    invalid = old_draft(S.VALIDATION_FAILED, valid=False)
    rejections = Event.objects.rejections().count()
    arrivals = Event.objects.filter(to_state__in=[S.REJECTED, S.VALIDATION_FAILED]).count()

    assert apply_retention().items == 2

    assert Event.objects.rejections().count() == rejections
    assert Event.objects.filter(to_state__in=[S.REJECTED, S.VALIDATION_FAILED]).count() == arrivals
    assert len(erased_events(rejected.item)) == len(erased_events(invalid.item)) == 1


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_pass_waits_for_an_owner_repairing_an_unusable_draft_and_leaves_it_whole(owner):
    """Approving locks the item; a pass that chose drafts without waiting for it would erase the
    text of a draft an approval then names."""
    draft = old_draft(S.VALIDATION_FAILED, valid=False, text="Too short to use, and about to be repaired")
    with transaction.atomic():
        approve_version(
            item_id=draft.item_id,
            version_id=draft.pk,
            version_hash=draft.content_hash,
            approver=owner,
            content=(
                f"A sturdy board made from oak for {draft.item.product.sku}. "
                "It measures 40 x 25 cm and suits daily use."
            ),
        )
        thread, other = a_pass_waiting_beside()
    thread.join()

    draft.refresh_from_db()
    assert other["done"].drafts == 0
    assert draft.content_expired_at is None and draft.content == "Too short to use, and about to be repaired"
    assert not erased_events(draft.item)
