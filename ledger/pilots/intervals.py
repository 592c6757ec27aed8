"""How sure a comparison of a pilot's arms is (SPEC §8: acceptance and preference per arm with 95 %
intervals; issue 30 point 5): the statistics of `ledger.pilots.arms`, in one place.

- A share (an arm's acceptance, or how often its draft was preferred) with Wilson's score interval at
  95 % (z = 1.959964): `share`.
- Two arms' acceptance: the difference of two independent shares with Newcombe's hybrid score interval
  (Newcombe 1998, method 10: built from each share's Wilson interval). The arms are told apart when it
  excludes 0. Two arms of a same-sample pilot drafted the same products, so their shares are paired;
  treating them as independent ignores that pairing and errs on the cautious side when a product that
  is hard for one arm is hard for the other (a wider interval, more decisions asked for).
- Preferences between two arms: a sign test on the comparisons that preferred one draft only ("both"
  and "neither" are ties, left out of the test as a sign test leaves ties out): arm a's share of them
  with its 95 % Wilson interval, told apart from chance when it excludes 1/2 (Wilson's interval is the
  inversion of the score test, so this is the two-sided score test at 5 %).
- When not yet told apart, how many decisions would settle it at the rates observed, at 5 % two-sided
  and 80 % power: for acceptance, each arm's decisions from the classical formula for two independent
  shares (Fleiss, without continuity correction); for preference, the one-sample score test against
  1/2 (Chow, Shao & Wang 2008, §4.1), divided by the share of comparisons that preferred one draft
  only, since ties tell nothing. Equal rates are settled by no number of decisions: None.
"""

import math
from dataclasses import dataclass
from decimal import Decimal

from .projection import Range, wilson

# The standard normal's 97.5th and 80th percentiles: 95 % two-sided, and 80 % power.
Z_95 = Decimal("1.959964")
Z_POWER_80 = Decimal("0.841621")
HALF = Decimal("0.5")


@dataclass(frozen=True)
class Difference:
    """The first share minus the second, with its interval; `settled` when the interval excludes 0."""

    expected: Decimal
    low: Decimal
    high: Decimal

    @property
    def settled(self) -> bool:
        return self.low > 0 or self.high < 0


def share(successes: int, trials: int) -> Range | None:
    """`successes / trials` with its 95 % Wilson interval; None without trials."""
    return wilson(successes, trials, Z_95)


def difference(first: tuple[int, int], second: tuple[int, int]) -> Difference | None:
    """(successes, trials) of two independent shares: the first minus the second, with Newcombe's hybrid
    score interval at 95 %; None unless both have trials."""
    one, two = share(*first), share(*second)
    if one is None or two is None:
        return None
    expected = one.expected - two.expected
    below = ((one.expected - one.low) ** 2 + (two.high - two.expected) ** 2).sqrt()
    above = ((one.high - one.expected) ** 2 + (two.expected - two.low) ** 2).sqrt()
    return Difference(expected, expected - below, expected + above)


def per_group_for_two_shares(
    p1: Decimal, p2: Decimal, z_alpha: Decimal = Z_95, z_beta: Decimal = Z_POWER_80
) -> int | None:
    """Trials each group needs for a two-sided test of p1 = p2 at `z_alpha` to find the difference with
    the power of `z_beta`, if the shares are p1 and p2 (Fleiss, no continuity correction); None if equal."""
    if p1 == p2:
        return None
    mean = (p1 + p2) / 2
    n = (z_alpha * (2 * mean * (1 - mean)).sqrt() + z_beta * (p1 * (1 - p1) + p2 * (1 - p2)).sqrt()) ** 2 / (
        p1 - p2
    ) ** 2
    return math.ceil(n)


def trials_for_one_share(
    p: Decimal, p0: Decimal, z_alpha: Decimal = Z_95, z_beta: Decimal = Z_POWER_80
) -> int | None:
    """Trials a score test of the share = p0 needs to find it, if it is p, with the power of `z_beta`
    (`z_alpha`: 1.959964 for 5 % two-sided, 1.644854 for 5 % one-sided); None if p is p0."""
    if p == p0:
        return None
    null = p0 * (1 - p0)
    n = null * ((z_alpha + z_beta * (p * (1 - p) / null).sqrt()) / (p - p0)) ** 2
    return math.ceil(n)


@dataclass(frozen=True)
class Preferences:
    """Two arms' blind comparisons: how many preferred arm a's draft only, arm b's only, both, neither."""

    a: int
    b: int
    both: int
    neither: int

    @property
    def comparisons(self) -> int:
        return self.a + self.b + self.both + self.neither

    @property
    def decisive(self) -> int:
        return self.a + self.b

    def a_share_of_decisive(self) -> Range | None:
        """Arm a's share of the comparisons that preferred one draft only, with its 95 % interval."""
        return share(self.a, self.decisive)

    def settled(self) -> bool:
        """Told apart from a coin toss: the interval of arm a's share of the decisive ones excludes 1/2."""
        won = self.a_share_of_decisive()
        return won is not None and (won.low > HALF or won.high < HALF)

    def more_needed(self) -> int | None:
        """Comparisons still needed, at the shares observed, to settle it (0 once settled); None when
        no number would (no comparison preferred one draft only, or each arm was preferred as often)."""
        if self.settled():
            return 0
        won = self.a_share_of_decisive()
        if won is None:
            return None
        decisive = trials_for_one_share(won.expected, HALF)
        if decisive is None:
            return None
        needed = math.ceil(decisive * self.comparisons / self.decisive)
        return max(0, needed - self.comparisons)


def more_decisions_for_acceptance(first: tuple[int, int], second: tuple[int, int]) -> int | None:
    """(approved, decided) of two arms: decisions still needed, between them, at the acceptance rates
    observed, to tell the arms apart (0 once told apart); None when no number would (equal rates) or
    an arm has no decision yet."""
    apart = difference(first, second)
    if apart is None:
        return None
    if apart.settled:
        return 0
    each = per_group_for_two_shares(Decimal(first[0]) / first[1], Decimal(second[0]) / second[1])
    if each is None:
        return None
    return max(0, each - first[1]) + max(0, each - second[1])
