"""From what a pilot measured to the whole scope (issue 19 point 3, issue 27 point 1), with a 90 %
range. Plain arithmetic on the pilot's observations, no database: each step is written out so a reader
can redo it by hand (tests/ledger/pilots/test_pilot_projection.py does, on a known pilot, and checks on
simulated uneven catalogues that the range holds the true cost).

Every measure is the stratum's own, weighted by the stratum's share of the scope (N_h products), so a
large stratum that the sample drew few of counts for what it is in the scope, not in the sample.

- Cost of a draft: per stratum, the mean cost of its first drafts, with the standard error of that mean
  (finite-population correction, 1 − n_h/N_h). A stratum with one draft takes the pilot's pooled
  variance; one with none, the pooled mean.
- Rates per stratum, each with Wilson's interval at z = 1.645 (90 %): its first drafts' usable share
  (approved; a draft that failed validation or was rejected is unusable), its redrafts' usable share
  (drafts after an item's first), its validation failures among drafts judged, its acceptance among
  decisions. A stratum with nothing measured borrows the pilot's pooled share with the interval of a
  single observation (wider). A stratum whose redrafts were never measured takes its first drafts'
  usable share as a redraft's.
- First pass: one draft for every product of the scope, Σ N_h · mean_h.
- Reprocessing: a product whose first draft is unusable is drafted again, at the stratum's cost of a
  draft, until a draft is usable or MAX_REDRAFTS redrafts were made: with p the first draft's usable
  share and r a redraft's, (1 − p) · (1 + (1 − r) + … + (1 − r)^(K−1)) redrafts per product, and
  (1 − p) · (1 − r)^K of the products stay unusable.
- Ranges: per stratum, the cost's error (± z · N_h · drafts per product · standard error) and the
  rates' (the figure at the ends of the rates' intervals) combine as independent parts, square root
  of the sum of squares, and so do the strata. A total's range is worked out on the total (first pass
  and reprocessing share the cost of a draft), so its ends are not the sums of its parts' ends.
- Revisions: each revision of a product drafts it again; one month of them at the catalogue's own
  rate is reported beside the cost, not in it (a recurring cost, not the scope's).
- Review hours: a decision for each valid draft, first drafts and redrafts,
  Σ N_h · (1 − invalid_h) · (1 + redrafts per product_h), at the median seconds a pilot decision
  took; its range from the rates' ends and the median's distribution-free 90 % interval (order
  statistics of the binomial).
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
# One month of the catalogue's revisions is reported beside the cost.
REVISION_MONTHS = 1
# The redrafts a product of the full job is given before it is left unusable. Nothing in the ledger
# redrafts an unusable draft by itself (an operator or a reviewer asks for each; MAX_INFERENCE_ATTEMPTS
# bounds only transient failures, at 3): the projection assumes as many redrafts, at most.
MAX_REDRAFTS = 3
# A stratum is named among the risks when this share of its products or more would stay unusable,
# or when every draft of it the pilot measured was unusable.
RISK_SHARE = Decimal("0.10")
ALWAYS_FAILS = "always_fails"
STAYS_UNUSABLE = "stays_unusable"
RISK_WORDS = {
    ALWAYS_FAILS: (
        "Every draft the pilot made for {stratum} was unusable: about {staying} of its {products} products "
        "({share}) would stay unusable after {redrafts} redrafts, and {amount} would be spent on unusable drafts."
    ),
    STAYS_UNUSABLE: (
        "About {staying} of the {products} products of {stratum} ({share}) would stay unusable after "
        "{redrafts} redrafts; {amount} would be spent on unusable drafts."
    ),
}
ONE = Decimal(1)


@dataclass(frozen=True)
class Range:
    expected: Decimal
    low: Decimal
    high: Decimal

    def __add__(self, other: "Range") -> "Range":
        return Range(self.expected + other.expected, self.low + other.low, self.high + other.high)

    def times(self, factor: Decimal) -> "Range":
        return Range(self.expected * factor, self.low * factor, self.high * factor)

    def widened(self, error: Decimal) -> "Range":
        """This range with an independent error of ± `error` added to each side (in quadrature)."""
        below = ((self.expected - self.low) ** 2 + error**2).sqrt()
        above = ((self.high - self.expected) ** 2 + error**2).sqrt()
        return Range(self.expected, self.expected - below, self.expected + above)


def mean(values: list[Decimal]) -> Decimal:
    return sum(values, Decimal(0)) / len(values)


def variance(values: list[Decimal]) -> Decimal:
    """The sample variance (n − 1); 0 for fewer than two values."""
    if len(values) < 2:
        return Decimal(0)
    centre = mean(values)
    return sum(((value - centre) ** 2 for value in values), Decimal(0)) / (len(values) - 1)


@dataclass(frozen=True)
class DraftCost:
    """A stratum's cost of one draft: the mean of its first drafts and that mean's standard error."""

    mean: Decimal
    error: Decimal


def draft_costs(strata: list[tuple[int, list[Decimal]]]) -> list[DraftCost] | None:
    """Each stratum's cost of a draft from its (N_h, first drafts' costs): see the module's docstring.
    None when nothing was measured."""
    pooled = [value for _, values in strata for value in values]
    if not pooled:
        return None
    pooled_mean, pooled_variance = mean(pooled), variance(pooled)
    found = []
    for size, values in strata:
        n = len(values)
        if n == 0:
            found.append(DraftCost(pooled_mean, (pooled_variance / len(pooled)).sqrt()))
            continue
        share_unseen = max(Decimal(0), 1 - Decimal(n) / size) if size else Decimal(0)
        spread = variance(values) if n > 1 else pooled_variance
        found.append(DraftCost(mean(values), (share_unseen * spread / n).sqrt()))
    return found


def stratified_total(strata: list[tuple[int, list[Decimal]]]) -> Range | None:
    """The scope's total of a per-product value from its strata's (N_h, values drawn):
    Σ N_h · mean_h ± z · √(Σ N_h² · error_h²). None when nothing was measured."""
    costs = draft_costs(strata)
    if costs is None:
        return None
    return spend([(size, cost, Range(ONE, ONE, ONE)) for (size, _), cost in zip(strata, costs, strict=True)])


def spend(parts: list[tuple[int, DraftCost, Range]]) -> Range:
    """Σ products · cost of a draft · drafts per product over `parts`, one per stratum. Each part's
    range combines the cost's error (± z · products · drafts · standard error) and the drafts' range,
    as independent parts; the strata combine the same way."""
    return combined(
        [
            Range(
                products * cost.mean * drafts.expected,
                products * cost.mean * drafts.low,
                products * cost.mean * drafts.high,
            ).widened(Z * products * drafts.expected * cost.error)
            for products, cost, drafts in parts
        ]
    )


def combined(parts: list[Range]) -> Range:
    """The sum of independent ranges: expected values added, each side's half-widths in quadrature;
    never below zero."""
    expected = sum((part.expected for part in parts), Decimal(0))
    below = sum(((part.expected - part.low) ** 2 for part in parts), Decimal(0)).sqrt()
    above = sum(((part.high - part.expected) ** 2 for part in parts), Decimal(0)).sqrt()
    return Range(expected, max(Decimal(0), expected - below), expected + above)


def weighted_share(parts: list[tuple[int, Range]]) -> Range:
    """The scope's share from its strata's (N_h, share): Σ N_h · share_h / N, ranges combined."""
    size = sum(products for products, _ in parts)
    return combined([share.times(Decimal(products) / size) for products, share in parts])


def wilson(successes: int, trials: int, z: Decimal = Z) -> Range | None:
    """The share `successes / trials` with Wilson's score interval at z; None without trials."""
    if not trials:
        return None
    return wilson_at(Decimal(successes) / trials, Decimal(trials), z)


def wilson_at(share: Decimal, n: Decimal, z: Decimal = Z) -> Range:
    z2 = z * z
    denominator = 1 + z2 / n
    centre = (share + z2 / (2 * n)) / denominator
    half = z * (share * (1 - share) / n + z2 / (4 * n * n)).sqrt() / denominator
    return Range(share, max(Decimal(0), centre - half), min(Decimal(1), centre + half))


def borrowed(pooled: Range) -> Range:
    """A stratum with nothing measured: the pooled share, with the interval of one observation
    (or the pooled one, if that is wider)."""
    one = wilson_at(pooled.expected, ONE)
    return Range(pooled.expected, min(pooled.low, one.low), max(pooled.high, one.high))


def own_or_pooled(successes: int, trials: int, pooled: Range) -> Range:
    return wilson(successes, trials) or borrowed(pooled)


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


def redrafts_per_product(first_usable: Decimal, redraft_usable: Decimal) -> Decimal:
    """The redrafts a product is expected to need: its first draft unusable (1 − p), then redrafts
    until one is usable (each with r) or MAX_REDRAFTS were made: (1 − p) · Σ (1 − r)^k, k < K."""
    if redraft_usable == 0:
        return (1 - first_usable) * MAX_REDRAFTS
    return (1 - first_usable) * (1 - (1 - redraft_usable) ** MAX_REDRAFTS) / redraft_usable


def still_unusable(first_usable: Decimal, redraft_usable: Decimal) -> Decimal:
    """The share of products whose every draft, the first and MAX_REDRAFTS redrafts, is unusable."""
    return (1 - first_usable) * (1 - redraft_usable) ** MAX_REDRAFTS


def both_ends(rule, first: Range, redraft: Range) -> Range:
    """`rule` (fewer with better rates) at the rates' expected values and ends."""
    return Range(
        rule(first.expected, redraft.expected), rule(first.high, redraft.high), rule(first.low, redraft.low)
    )


@dataclass(frozen=True)
class StratumProjection:
    """One stratum's measures, as the projection uses them."""

    products: int  # N_h, in the scope
    approved_in_pilot: int  # products whose pilot draft was approved: the full job leaves them out
    draft_cost: DraftCost | None  # None: the model has no known price
    first_draft_usable: Range
    redraft_usable: Range
    redrafts_measured: int  # redrafts of the pilot judged usable or not; 0: r is the first drafts'
    always_failed: bool  # every draft measured was unusable
    invalid_rate: Range
    acceptance_rate: Range

    @property
    def redrafts_per_product(self) -> Range:
        return both_ends(redrafts_per_product, self.first_draft_usable, self.redraft_usable)

    @property
    def still_unusable(self) -> Range:
        return both_ends(still_unusable, self.first_draft_usable, self.redraft_usable)

    @property
    def drafts_per_product(self) -> Range:
        return Range(ONE, ONE, ONE) + self.redrafts_per_product

    @property
    def unusable_drafts_per_product(self) -> Range:
        """Drafts that end unusable: every draft but the usable one, (1 + redrafts) − (1 − still
        unusable)."""
        return both_ends(
            lambda p, r: redrafts_per_product(p, r) + still_unusable(p, r),
            self.first_draft_usable,
            self.redraft_usable,
        )

    @property
    def decisions_per_product(self) -> Range:
        """A decision for each valid draft; fewer with more invalid drafts and better rates."""
        drafts = self.drafts_per_product
        return Range(
            drafts.expected * (1 - self.invalid_rate.expected),
            drafts.low * (1 - self.invalid_rate.high),
            drafts.high * (1 - self.invalid_rate.low),
        )

    @property
    def cost(self) -> Range | None:
        """The stratum's first pass and reprocessing; None without a price."""
        if self.draft_cost is None:
            return None
        return spend([(self.products, self.draft_cost, self.drafts_per_product)])

    @property
    def at_risk(self) -> bool:
        return self.always_failed or self.still_unusable.expected >= RISK_SHARE


@dataclass(frozen=True)
class Projection:
    """The whole scope, in the provider's currency (USD) and hours."""

    scope_products: int
    strata: list[StratumProjection]
    invalid_rate: Range
    acceptance_rate: Range
    unusable_share: Range  # first drafts
    still_unusable: Range  # after MAX_REDRAFTS
    revisions_per_product_per_month: Decimal
    decisions: Range
    seconds_per_decision: Range
    review_hours: Range
    # The provider's hours with the scope's units side by side (each as long as the pilot's time per
    # request makes a unit of the job's size), and with every unit one after another.
    provider_hours: Decimal | None
    provider_hours_one_after_another: Decimal | None

    @property
    def price_known(self) -> bool:
        return all(stratum.draft_cost is not None for stratum in self.strata)

    def spend(self, drafts, products=lambda stratum: stratum.products) -> Range | None:
        """Σ over strata of products · cost of a draft · `drafts(stratum)`; None without a price."""
        if not self.price_known:
            return None
        return spend([(products(s), s.draft_cost, drafts(s)) for s in self.strata])

    @property
    def first_pass(self) -> Range | None:
        return self.spend(lambda stratum: Range(ONE, ONE, ONE))

    @property
    def reprocessing(self) -> Range | None:
        return self.spend(lambda stratum: stratum.redrafts_per_product)

    @property
    def cost(self) -> Range | None:
        return self.spend(lambda stratum: stratum.drafts_per_product)

    @property
    def rest_cost(self) -> Range | None:
        """The full job's: the scope without the products whose pilot draft was approved."""
        return self.spend(
            lambda stratum: stratum.drafts_per_product,
            lambda stratum: stratum.products - stratum.approved_in_pilot,
        )

    @property
    def regeneration_from_revisions(self) -> Range | None:
        """One month of the catalogue's revisions, each drafting its product once more."""
        first = self.first_pass
        return first.times(self.revisions_per_product_per_month * REVISION_MONTHS) if first else None

    def wasted(self, stratum: StratumProjection) -> Range | None:
        """The stratum's spend on drafts that end unusable."""
        if stratum.draft_cost is None:
            return None
        return spend([(stratum.products, stratum.draft_cost, stratum.unusable_drafts_per_product)])


def stratum_projection(
    products: int,
    seen: Observations,
    cost: DraftCost | None,
    pooled: "Pooled",
) -> StratumProjection:
    first = own_or_pooled(seen.first_drafts_usable, seen.first_drafts_settled, pooled.first_draft_usable)
    return StratumProjection(
        products=products,
        approved_in_pilot=seen.approved_items,
        draft_cost=cost,
        first_draft_usable=first,
        redraft_usable=wilson(seen.redrafts_usable, seen.redrafts_settled) or first,
        redrafts_measured=seen.redrafts_settled,
        always_failed=bool(seen.first_drafts_settled)
        and not seen.first_drafts_usable
        and not seen.redrafts_usable,
        invalid_rate=own_or_pooled(seen.invalid, seen.judged, pooled.invalid_rate),
        acceptance_rate=own_or_pooled(seen.approvals, seen.decisions, pooled.acceptance_rate),
    )


@dataclass(frozen=True)
class Pooled:
    """The pilot's shares in all, which a stratum with nothing measured borrows."""

    invalid_rate: Range
    acceptance_rate: Range
    first_draft_usable: Range

    @classmethod
    def of(cls, seen: Observations) -> "Pooled":
        invalid = wilson(seen.invalid, seen.judged)
        accepted = wilson(seen.approvals, seen.decisions)
        # Without a first draft settled (only redrafts decided), a valid draft accepted.
        usable = wilson(seen.first_drafts_usable, seen.first_drafts_settled) or Range(
            (1 - invalid.expected) * accepted.expected,
            (1 - invalid.high) * accepted.low,
            (1 - invalid.low) * accepted.high,
        )
        return cls(invalid, accepted, usable)


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
    pooled = Pooled.of(seen)
    size = sum(products for products, _ in strata)
    costs = draft_costs([(products, o.first_draft_costs) for products, o in strata]) if price_known else None
    projected = [
        stratum_projection(products, observations, costs[n] if costs else None, pooled)
        for n, (products, observations) in enumerate(strata)
    ]
    decided = combined([s.decisions_per_product.times(Decimal(s.products)) for s in projected])
    seconds = median_range(seen.decision_seconds)
    review = Range(
        decided.expected * seconds.expected / HOUR,
        decided.low * seconds.low / HOUR,
        decided.high * seconds.high / HOUR,
    )
    return Projection(
        scope_products=size,
        strata=projected,
        invalid_rate=weighted_share([(s.products, s.invalid_rate) for s in projected]),
        acceptance_rate=weighted_share([(s.products, s.acceptance_rate) for s in projected]),
        unusable_share=weighted_share(
            [
                (s.products, both_ends(lambda p, r: 1 - p, s.first_draft_usable, s.redraft_usable))
                for s in projected
            ]
        ),
        still_unusable=weighted_share([(s.products, s.still_unusable) for s in projected]),
        revisions_per_product_per_month=revisions_per_product_per_month,
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
