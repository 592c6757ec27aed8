"""The statistics of the arms report (`ledger.pilots.intervals`) against published values, not against
themselves: Newcombe's tables of Wilson's interval and of his hybrid score interval of a difference,
and two sample sizes worked in published references."""

from decimal import Decimal

import pytest

from ledger.pilots.intervals import (
    Preferences,
    difference,
    more_decisions_for_acceptance,
    per_group_for_two_shares,
    share,
    trials_for_one_share,
)

FOUR = Decimal("0.0001")


def rounded(value: Decimal) -> Decimal:
    return value.quantize(FOUR)


@pytest.mark.parametrize(
    ("successes", "trials", "low", "high"),
    [
        # Newcombe RG (1998), "Two-sided confidence intervals for the single proportion: comparison of
        # seven methods", Statistics in Medicine 17:857-872, Table I, method 3 (score, no correction).
        (81, 263, "0.2553", "0.3662"),
        (15, 148, "0.0624", "0.1605"),
        (0, 20, "0.0000", "0.1611"),
        (1, 29, "0.0061", "0.1718"),
        # 40 of 50, the example the issue gave: 0.6696 to 0.8876.
        (40, 50, "0.6696", "0.8876"),
    ],
)
def test_a_share_has_wilsons_interval(successes, trials, low, high):
    interval = share(successes, trials)

    assert interval.expected == Decimal(successes) / trials
    assert (rounded(interval.low), rounded(interval.high)) == (Decimal(low), Decimal(high))


def test_a_share_of_nothing_has_no_interval():
    assert share(0, 0) is None


@pytest.mark.parametrize(
    ("first", "second", "low", "high"),
    [
        # Newcombe RG (1998), "Interval estimation for the difference between independent proportions:
        # comparison of eleven methods", Statistics in Medicine 17:873-890, Table II, method 10.
        ((56, 70), (48, 80), "0.0524", "0.3339"),
        ((9, 10), (3, 10), "0.1705", "0.8090"),
        ((5, 56), (0, 29), "-0.0381", "0.1926"),
        ((0, 10), (0, 20), "-0.1611", "0.2775"),
        ((10, 10), (0, 10), "0.6075", "1.0000"),
    ],
)
def test_a_difference_has_newcombes_hybrid_score_interval(first, second, low, high):
    apart = difference(first, second)

    assert (rounded(apart.low), rounded(apart.high)) == (Decimal(low), Decimal(high))
    assert apart.settled == (Decimal(low) > 0)


def test_the_classical_sample_size_for_two_shares():
    # JMP's documentation (Two Sample Proportions): 0.08 against 0.06, 5 % two-sided, 80 % power: 2554.
    assert per_group_for_two_shares(Decimal("0.08"), Decimal("0.06")) == 2554
    assert per_group_for_two_shares(Decimal("0.3"), Decimal("0.3")) is None


def test_the_sample_size_of_a_score_test_of_one_share():
    # Chow, Shao & Wang (2008), Sample Size Calculations in Clinical Research, p. 85, as worked by
    # powerandsamplesize.com (1-sample, 1-sided): p = 0.05 against 0.02, 5 % one-sided, 80 % power: 191.
    assert trials_for_one_share(Decimal("0.05"), Decimal("0.02"), z_alpha=Decimal("1.644854")) == 191
    assert trials_for_one_share(Decimal("0.5"), Decimal("0.5")) is None


def test_acceptance_told_apart_needs_no_more_decisions():
    assert more_decisions_for_acceptance((56, 70), (48, 80)) == 0


def test_acceptance_not_told_apart_says_how_many_more_decisions_would_settle_it():
    # 0.8 against 0.6 (Fleiss, no correction): 82 decisions an arm, the two have 10 each.
    assert difference((8, 10), (6, 10)).settled is False
    assert per_group_for_two_shares(Decimal("0.8"), Decimal("0.6")) == 82
    assert more_decisions_for_acceptance((8, 10), (6, 10)) == 2 * (82 - 10)
    assert more_decisions_for_acceptance((5, 10), (5, 10)) is None
    assert more_decisions_for_acceptance((5, 10), (0, 0)) is None


def test_preferences_leave_ties_out_of_the_sign_test():
    even = Preferences(a=6, b=4, both=5, neither=5)

    assert even.comparisons == 20 and even.decisive == 10
    assert even.a_share_of_decisive().expected == Decimal("0.6")
    assert not even.settled()
    # A score test of 0.6 against 1/2, two-sided 5 %, 80 % power, needs 194 decisive comparisons; half
    # the comparisons so far were decisive, so 388 comparisons in all: 368 more.
    assert trials_for_one_share(Decimal("0.6"), Decimal("0.5")) == 194
    assert even.more_needed() == 388 - 20


def test_preferences_told_apart_or_never():
    assert Preferences(a=15, b=2, both=1, neither=0).settled()
    assert Preferences(a=15, b=2, both=1, neither=0).more_needed() == 0
    assert Preferences(a=3, b=3, both=0, neither=2).more_needed() is None
    assert Preferences(a=0, b=0, both=2, neither=2).more_needed() is None
    assert Preferences(a=0, b=0, both=0, neither=0).a_share_of_decisive() is None
