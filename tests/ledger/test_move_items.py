"""Moving many items at once writes the same events, one an item, as moving each by itself."""

import pytest

from ledger.actions.core import change_state, move_items
from ledger.database.setwise import ids_query
from ledger.models import Event, Item
from ledger.states import ItemState
from tests.factories import ItemFactory, JobFactory, UserFactory

pytestmark = pytest.mark.django_db

FIELDS = ("job_id", "submission_id", "from_state", "to_state", "actor_id", "actor_name", "reason", "data")


def test_many_items_moved_at_once_get_the_events_each_moved_alone_gets():
    operator = UserFactory(roles=["operator"])
    job = JobFactory()
    alone, *together = [ItemFactory(job=job) for _ in range(4)]
    elsewhere = ItemFactory(job=job, state=ItemState.SUBMITTED)

    change_state(alone.pk, to=ItemState.CANCELLED, actor=operator, reason="stopped", data={"why": ["x", 1]})
    moved = move_items(
        [item.pk for item in [*reversed(together), elsewhere]],
        from_state=ItemState.PREPARED,
        to=ItemState.CANCELLED,
        actor=operator,
        reason="stopped",
        data={"why": ["x", 1]},
    )

    assert sorted(moved) == sorted(item.pk for item in together)
    expected = Event.objects.filter(item=alone).values_list(*FIELDS).get()
    events = list(Event.objects.filter(item__in=together).order_by("id").values_list("item_id", *FIELDS))
    assert events == [(item.pk, *expected) for item in sorted(together, key=lambda item: item.pk)]
    assert not Event.objects.filter(item=elsewhere).exclude(to_state=ItemState.SUBMITTED).exists()


def test_ids_sent_as_one_parameter_select_what_a_list_of_them_selects():
    job = JobFactory()
    items = [ItemFactory(job=job) for _ in range(5)]
    ids = [items[3].pk, items[0].pk, items[0].pk, 10**12]

    assert sorted(Item.objects.filter(pk__in=ids_query(ids)).values_list("pk", flat=True)) == sorted(
        Item.objects.filter(pk__in=ids).values_list("pk", flat=True)
    )
    assert not Item.objects.filter(pk__in=ids_query([])).exists()
