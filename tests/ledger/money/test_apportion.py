from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.money.apportion import split_exactly


def test_parts_follow_the_weights_and_add_up():
    assert split_exactly(Decimal("0.000549"), [Decimal(1), Decimal(1), Decimal(1)]) == [
        Decimal("0.000183"),
        Decimal("0.000183"),
        Decimal("0.000183"),
    ]
    parts = split_exactly(Decimal("1.000000"), [Decimal(1), Decimal(1), Decimal(1)])
    assert sum(parts) == Decimal("1.000000")
    assert sorted(parts) == [Decimal("0.333333"), Decimal("0.333333"), Decimal("0.333334")]


def test_no_weight_splits_evenly_and_a_total_off_the_places_is_refused():
    assert split_exactly(Decimal("0.02"), [Decimal(0), Decimal(0)], Decimal("0.01")) == [
        Decimal("0.01"),
        Decimal("0.01"),
    ]
    with pytest.raises(ValueError):
        split_exactly(Decimal("0.0000001"), [Decimal(1)])


@given(
    st.integers(min_value=0, max_value=10**12),
    st.lists(st.decimals(min_value=0, max_value=10**6, places=6), min_size=1, max_size=60),
)
def test_parts_always_add_up_to_the_total(micros, weights):
    total = Decimal(micros) / 10**6
    parts = split_exactly(total, weights)
    assert sum(parts, Decimal(0)) == total
    assert all(part >= 0 for part in parts)
