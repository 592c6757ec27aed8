"""A job's cost shared among its groups (ledger/money/cost_groups.py): whatever digits the job's total
has, the parts add up to it."""

from decimal import Decimal

from ledger.money.cost_groups import split_job_cost
from ledger.money.pricing import price_for


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
