"""A job's cost shared among its groups (ledger/money/cost_groups.py): whatever digits the job's total
has, the parts add up to it."""

from decimal import Decimal

import pytest

from ledger.models import Item, ItemTally
from ledger.money.cost_groups import STATE, grouped_tokens, split_job_cost
from ledger.money.pricing import TALLY_SUMS, price_for
from ledger.states import ItemState
from tests.factories import ItemFactory, JobFactory, add_version


def rows(*tokens: int) -> list[dict]:
    return [
        {
            "key": f"group {n}",
            "items": 1,
            "approved_drafts": 0,
            "all_input": count,
            "all_output": count,
            "approved_input": 0,
            "approved_output": 0,
            "pending_input": 0,
            "pending_output": 0,
        }
        for n, count in enumerate(tokens)
    ]


def test_a_total_with_more_digits_than_the_ledgers_is_shared_to_its_last_digit():
    cost = {
        "currency": "GBP",
        "total": Decimal("0.00054912"),
        "wasted": Decimal("0.00054912"),
        "provider_currency": {"total": Decimal("0.000696"), "wasted": Decimal("0.000696")},
    }
    groups = split_job_cost(cost, price_for("openai", "gpt-4o-mini"), rows(100, 200, 400))
    assert sum(g.amount for g in groups) == Decimal("0.00054912")
    assert sum(g.provider_amount for g in groups) == Decimal("0.000696")
    assert groups[2].amount > groups[1].amount > groups[0].amount


def test_without_a_price_every_amount_is_none():
    cost = {
        "currency": "USD",
        "total": None,
        "wasted": None,
        "provider_currency": {"total": None, "wasted": None},
    }
    [group] = split_job_cost(cost, None, rows(100))
    assert (group.amount, group.wasted, group.per_approved, group.items) == (None, None, None, 1)


@pytest.mark.django_db
def test_the_groups_count_tokens_as_the_tallies_do_in_every_state():
    """The groups' approved, pending and all-draft tokens are the tallies' (the database's triggers),
    state by state: approved drafts of discarded items, redrafts waiting for a decision, drafts a retry
    replaced. A rule changed on one side only fails here."""
    job = JobFactory()
    for number, state in enumerate(ItemState):
        for approved in (False, True):
            item = ItemFactory(job=job, state=state)
            first = add_version(item, input_tokens=100 + number, output_tokens=10 + number)
            second = add_version(item, input_tokens=1_000 + number, output_tokens=20 + number)
            if approved:
                Item.objects.filter(pk=item.pk).update(approved_version=first if number % 2 else second)
    tallies = {
        row.pop("state"): row
        for row in ItemTally.objects.filter(job=job).order_by().values("state").annotate(**TALLY_SUMS)
    }
    for row in grouped_tokens([job.pk], STATE):
        tally = tallies[row["key"]]
        assert (row["items"], row["approved_drafts"]) == (tally["items"], tally["approved_drafts"]), row[
            "key"
        ]
        for name in (
            "all_input",
            "all_output",
            "approved_input",
            "approved_output",
            "pending_input",
            "pending_output",
        ):
            assert row[name] == tally[name], (row["key"], name)
    assert len(tallies) == len(ItemState)
