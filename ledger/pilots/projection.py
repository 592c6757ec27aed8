"""From what a pilot measured to the whole scope (issue 19, point 3), with a 90 % range. Plain
arithmetic on the pilot's observations, no database: each step is written out so a reader can redo
it by hand (tests/ledger/pilots/test_pilot_projection.py does, on a known pilot).

The method, in short:
- Inference cost: each product of the scope needs one first draft. Stratified estimate of a total:
  Σ N_h · mean_h over the strata (N_h products in the scope, mean_h the mean cost of the first drafts
  drawn there), variance Σ N_h² · (1 − n_h/N_h) · s_h² / n_h, and the range ± z · √variance with
  z = 1.645 (normal, 90 % two-sided). A stratum with one draft takes the pilot's pooled variance; one
  with none yet, the pilot's pooled mean.
- Rates (validation failure, acceptance): the pilot's drafts and decisions in all, with Wilson's
  interval at the same z.
- Regeneration: each unusable draft (invalid, or valid and rejected: a share
  q = 1 − (1 − invalid rate) · acceptance rate) is drafted once more at the same cost, and each
  revision of a product drafts it again: one month of revisions at the catalogue's own rate. The
  low and high ends combine the ends of the rate and cost ranges (so the range is wider than 90 %).
- Review hours: a decision for each valid draft, first drafts and regenerated ones,
  N · (1 − invalid rate) · (1 + q), at the median seconds a pilot decision took; its range from the
  rates' ends and the median's distribution-free 90 % interval (order statistics of the binomial).
- Provider hours: the scope's requests at the provider's measured seconds per request (its work,
  unit after unit; units the provider runs side by side finish sooner).
"""

import math
import statistics
from dataclasses import dataclass
from decimal import Decimal

from .measure import Observations

Z = Decimal("1.645")
CONFIDENCE = Decimal("0.90")
HOUR = Decimal(3600)
# One month of the catalogue's revisions is counted in the regeneration cost.
REVISION_MONTHS = 1


@dataclass(frozen=True)
class Range:
    expected: Decimal
    low: Decimal
    high: Decimal

    def __add__(self, other: "Range") -> "Range":
        return Range(self.expected + other.expected, self.low + other.low, self.high + other.high)

    def times(self, factor: Decimal) -> "Range":
        return Range(self.expected * factor, self.low * factor, self.high * factor)


def mean(values: list[Decimal]) -> Decimal:
    return sum(values, Decimal(0)) / len(values)


def variance(values: list[Decimal]) -> Decimal:
    """The sample variance (n − 1); 0 for fewer than two values."""
    if len(values) < 2:
        return Decimal(0)
    centre = mean(values)
    return sum(((value - centre) ** 2 for value in values), Decimal(0)) / (len(values) - 1)


def stratified_total(strata: list[tuple[int, list[Decimal]]]) -> Range | None:
    """The scope's total of a per-product value from its strata's (N_h, values drawn): see the module's
    docstring. None when nothing was measured."""
    pooled = [value for _, values in strata for value in values]
    if not pooled:
        return None
    pooled_mean, pooled_variance = mean(pooled), variance(pooled)
    expected, spread = Decimal(0), Decimal(0)
    for size, values in strata:
        n = len(values)
        if n == 0:
            expected += size * pooled_mean
            spread += size * size * pooled_variance / len(pooled)
            continue
        share_unseen = max(Decimal(0), 1 - Decimal(n) / size) if size else Decimal(0)
        expected += size * mean(values)
        spread += size * size * share_unseen * (variance(values) if n > 1 else pooled_variance) / n
    half = Z * spread.sqrt()
    return Range(expected, max(Decimal(0), expected - half), expected + half)


def wilson(successes: int, trials: int) -> Range | None:
    """The share `successes / trials` with Wilson's score interval at z; None without trials."""
    if not trials:
        return None
    n, share = Decimal(trials), Decimal(successes) / trials
    z2 = Z * Z
    denominator = 1 + z2 / n
    centre = (share + z2 / (2 * n)) / denominator
    half = Z * (share * (1 - share) / n + z2 / (4 * n * n)).sqrt() / denominator
    return Range(share, max(Decimal(0), centre - half), min(Decimal(1), centre + half))


def median_range(values: list[Decimal]) -> Range | None:
    """The median and its distribution-free interval: the k-th smallest and k-th largest value, k the
    largest with P(Binomial(n, ½) < k) ≤ 5 %; with fewer than 5 values (no such k) the smallest and
    largest."""
    if not values:
        return None
    ordered, n = sorted(values), len(values)
    k, below = 0, 0
    while True:
        below += math.comb(n, k)  # P(B ≤ k) · 2ⁿ
        if below * 20 > 2**n:
            break
        k += 1
    k = max(k, 1)
    return Range(Decimal(statistics.median(ordered)), ordered[k - 1], ordered[n - k])


def unusable_share(invalid: Decimal, accepted: Decimal) -> Decimal:
    """The share of drafts that must be drafted again: invalid, or valid and rejected."""
    return 1 - (1 - invalid) * accepted


@dataclass(frozen=True)
class Projection:
    """The whole scope, in the provider's currency (USD) and hours."""

    scope_products: int
    invalid_rate: Range
    acceptance_rate: Range
    unusable_share: Range
    revisions_per_product_per_month: Decimal
    inference_cost: Range | None  # None: the model has no known price
    regeneration_from_failures: Range | None
    regeneration_from_revisions: Range | None  # one month's
    decisions: Range
    seconds_per_decision: Range
    review_hours: Range
    # The provider's hours with the scope's units side by side (each as long as the pilot's time per
    # request makes a unit of the job's size), and with every unit one after another.
    provider_hours: Decimal | None
    provider_hours_one_after_another: Decimal | None

    @property
    def regeneration_cost(self) -> Range | None:
        if self.regeneration_from_failures is None or self.regeneration_from_revisions is None:
            return None
        return self.regeneration_from_failures + self.regeneration_from_revisions

    @property
    def cost(self) -> Range | None:
        if self.inference_cost is None or self.regeneration_cost is None:
            return None
        return self.inference_cost + self.regeneration_cost


def project(
    strata: list[tuple[int, Observations]],
    *,
    price_known: bool,
    revisions_per_product_per_month: Decimal,
    provider_seconds_per_request: Decimal | None,
    unit_size: int,
) -> Projection:
    """`strata`: (products of the scope, what the pilot saw) for each stratum. Needs at least one
    judged draft and one decision (`report.decisions_needed` says when there are enough)."""
    seen = Observations()
    for _, observations in strata:
        seen.add(observations)
    size = sum(products for products, _ in strata)
    invalid = wilson(seen.invalid, seen.judged)
    accepted = wilson(seen.approvals, seen.decisions)
    share = Range(
        unusable_share(invalid.expected, accepted.expected),
        unusable_share(invalid.low, accepted.high),
        unusable_share(invalid.high, accepted.low),
    )
    inference = (
        stratified_total([(products, o.first_draft_costs) for products, o in strata]) if price_known else None
    )
    from_failures = from_revisions = None
    if inference is not None:
        from_failures = Range(
            share.expected * inference.expected, share.low * inference.low, share.high * inference.high
        )
        from_revisions = inference.times(revisions_per_product_per_month * REVISION_MONTHS)

    def decisions(invalid_rate: Decimal, acceptance: Decimal) -> Decimal:
        return size * (1 - invalid_rate) * (1 + unusable_share(invalid_rate, acceptance))

    # Fewer decisions with more invalid drafts and more accepted ones (each factor moves one way).
    decided = Range(
        decisions(invalid.expected, accepted.expected),
        decisions(invalid.high, accepted.high),
        decisions(invalid.low, accepted.low),
    )
    seconds = median_range(seen.decision_seconds)
    review = Range(
        decided.expected * seconds.expected / HOUR,
        decided.low * seconds.low / HOUR,
        decided.high * seconds.high / HOUR,
    )
    return Projection(
        scope_products=size,
        invalid_rate=invalid,
        acceptance_rate=accepted,
        unusable_share=share,
        revisions_per_product_per_month=revisions_per_product_per_month,
        inference_cost=inference,
        regeneration_from_failures=from_failures,
        regeneration_from_revisions=from_revisions,
        decisions=decided,
        seconds_per_decision=seconds,
        review_hours=review,
        provider_hours=(
            min(unit_size, size) * provider_seconds_per_request / HOUR
            if provider_seconds_per_request is not None
            else None
        ),
        provider_hours_one_after_another=(
            size * provider_seconds_per_request / HOUR if provider_seconds_per_request is not None else None
        ),
    )
