import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction

from ledger.actions.core import NotAllowed, change_state, move_items
from ledger.models import Event, Item
from ledger.states import (
    ALLOWED_TRANSITIONS,
    DECIDABLE_STATES,
    NEEDS_ATTENTION_STATES,
    STOPS,
    ItemState,
    JobState,
    ReasonCode,
    sources_for,
)
from tests.factories import ItemFactory, JobFactory

pytestmark = pytest.mark.django_db

ALL_PAIRS = [(a, b) for a in ItemState.values for b in ItemState.values]
ALLOWED = [(a, b) for a, b in ALL_PAIRS if b in ALLOWED_TRANSITIONS[a]]
REFUSED = [(a, b) for a, b in ALL_PAIRS if b not in ALLOWED_TRANSITIONS[a]]


def test_the_table_covers_every_state_and_matches_spec_counts():
    assert set(ALLOWED_TRANSITIONS) == set(ItemState.values)
    # SPEC §2 lists 56 allowed moves, and validation_failed -> approved (an owner's valid edit of an
    # unusable draft, issue 18) and the three moves of an undone decision (SPEC §8, issue 30:
    # approved and rejected -> awaiting_review, approved -> validation_failed for an undone repair);
    # a typo in the table would change this number.
    assert len(ALLOWED) == 60
    assert {s for s, nxt in ALLOWED_TRANSITIONS.items() if not nxt} == {
        "obsolete",
        "withdrawn",
        "applied",
        "cancelled",
    }


@pytest.mark.parametrize(("from_state", "to_state"), ALLOWED)
def test_every_allowed_transition_works_and_writes_one_event(from_state, to_state):
    item = ItemFactory(state=from_state)
    before = Event.objects.filter(item=item).count()

    changed = change_state(item.pk, to=to_state, reason="test move")

    assert changed.state == to_state
    assert Item.objects.get(pk=item.pk).state == to_state
    events = list(Event.objects.filter(item=item).order_by("id"))
    assert len(events) == before + 1
    assert (events[-1].from_state, events[-1].to_state, events[-1].reason) == (
        from_state,
        to_state,
        "test move",
    )


@pytest.mark.parametrize(("from_state", "to_state"), REFUSED)
def test_every_other_transition_is_refused_and_changes_nothing(from_state, to_state):
    item = ItemFactory(state=from_state, reason="as it was")
    history = list(Event.objects.filter(item=item).values_list("pk", flat=True))  # how it got there

    with pytest.raises(NotAllowed):
        change_state(item.pk, to=to_state, reason="should not happen")

    item.refresh_from_db()
    assert (item.state, item.reason) == (from_state, "as it was")
    assert list(Event.objects.filter(item=item).values_list("pk", flat=True)) == history


def test_expect_narrows_the_states_a_caller_moves_from():
    item = ItemFactory(state=ItemState.DEAD_LETTER)
    with pytest.raises(NotAllowed):
        change_state(item.pk, to=ItemState.PREPARED, expect=[ItemState.INFERENCE_FAILED])
    assert Item.objects.get(pk=item.pk).state == ItemState.DEAD_LETTER


def test_move_items_moves_only_those_in_the_given_state():
    ready = ItemFactory(state=ItemState.PREPARED)
    elsewhere = ItemFactory(state=ItemState.AWAITING_REVIEW)
    history = Event.objects.filter(item=elsewhere).count()  # how it got there

    moved = move_items([ready.pk, elsewhere.pk], from_state=ItemState.PREPARED, to=ItemState.SUBMITTED)

    assert moved == [ready.pk]
    assert Item.objects.get(pk=elsewhere.pk).state == ItemState.AWAITING_REVIEW
    assert Event.objects.filter(item=ready, to_state=ItemState.SUBMITTED).count() == 1
    assert Event.objects.filter(item=elsewhere).count() == history


def test_move_items_refuses_a_move_the_table_does_not_allow():
    item = ItemFactory(state=ItemState.PREPARED)
    with pytest.raises(NotAllowed):
        move_items([item.pk], from_state=ItemState.PREPARED, to=ItemState.APPLIED)
    assert Item.objects.get(pk=item.pk).state == ItemState.PREPARED


def test_the_database_refuses_a_state_that_does_not_exist():
    item = ItemFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        Item.objects.filter(pk=item.pk).update(state="done")
    assert Item.objects.get(pk=item.pk).state == ItemState.PREPARED


@pytest.mark.postgresql_only  # the guard is a PostgreSQL trigger
def test_events_cannot_be_updated_or_deleted_even_with_raw_sql():
    item = ItemFactory()
    change_state(item.pk, to=ItemState.SUBMITTED)
    event = Event.objects.get(item=item)

    with pytest.raises(ValueError):
        event.save()
    with pytest.raises(ValueError):
        event.delete()
    for statement in (
        "UPDATE ledger_event SET reason = 'rewritten' WHERE id = %s",
        "DELETE FROM ledger_event WHERE id = %s",
    ):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(statement, [event.pk])

    assert Event.objects.get(pk=event.pk).reason == ""


# --- one rule in one place -------------------------------------------------------------------


def test_a_reviewer_may_decide_exactly_where_an_approval_may_start():
    assert DECIDABLE_STATES == sources_for(ItemState.APPROVED)


def test_each_stop_has_its_words_and_its_code():
    assert set(STOPS) == {ItemState.WITHDRAWN, ItemState.OBSOLETE}
    assert STOPS[ItemState.WITHDRAWN].code == ReasonCode.PRODUCT_WITHDRAWN
    assert STOPS[ItemState.OBSOLETE].code == ReasonCode.PRODUCT_CHANGED
    for stop in STOPS.values():
        words = [stop.event, stop.refusal, stop.not_published, stop.note]
        assert all(words) and len(set(words)) == len(words)


def test_needs_attention_lists_waiting_items_of_live_jobs_only():
    waiting = {state: ItemFactory(state=state) for state in NEEDS_ATTENTION_STATES}
    ItemFactory(state=ItemState.OBSOLETE)
    ItemFactory(state=ItemState.AWAITING_REVIEW)
    ItemFactory(state=ItemState.DEAD_LETTER, job=JobFactory(state=JobState.CANCELLED))

    assert set(Item.objects.needs_attention()) == set(waiting.values())
