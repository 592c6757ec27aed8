"""The projection's arithmetic (ledger/pilots/projection.py), on numbers worked out by hand; and the
rules of the report it rests on: the words an edit changed, when enough is decided to project."""

from datetime import timedelta
from decimal import Decimal

import pytest

from ledger.actions.collecting import retry_inference
from ledger.actions.jobs import create_job
from ledger.actions.reviewing import approve_version, reject_version
from ledger.models import Pilot
from ledger.pilots.measure import Observations, observe, word_edit_distance
from ledger.pilots.projection import (
    MAX_REDRAFTS,
    RISK_SHARE,
    Range,
    median_range,
    project,
    redrafts_per_product,
    still_unusable,
    stratified_total,
    wilson,
)
from ledger.pilots.report import Decisions, decisions_needed
from ledger.pilots.sample import PilotPlan
from tests.factories import ProductFactory
from tests.pilots import SHOWN_AT, clock_at, draft

D = Decimal


def close(value: Decimal, expected: str, places: str = "0.000001") -> bool:
    return value.quantize(D(places)) == D(expected)


def test_a_stratified_total_and_its_90_percent_range():
    """Stratum A: 100 products, 0.01, 0.02, 0.03 drawn: mean 0.02, s² 0.0001, variance of its total
    100² × (1 − 3/100) × 0.0001 / 3 = 0.323333. Stratum B: 10 products, 0.05 twice: 0.5, no spread.
    2.5 ± 1.645 × √0.323333 = ± 0.935386."""
    total = stratified_total([(100, [D("0.01"), D("0.02"), D("0.03")]), (10, [D("0.05"), D("0.05")])])

    assert total.expected == D("2.5")
    assert close(total.low, "1.564613") and close(total.high, "3.435387")


def test_a_stratum_drawn_whole_adds_no_spread():
    total = stratified_total([(3, [D(1), D(2), D(3)])])
    assert total == Range(D(6), D(6), D(6))


def test_a_stratum_of_one_draw_takes_the_pooled_variance_and_one_of_none_the_pooled_mean():
    """Pooled: 1, 3, 2 (mean 2, s² 1). Stratum A (10, [1, 3]): 20, variance 100 × 0.8 × 2 / 2 = 80.
    Stratum B (5, [2]): 10, the pooled s²: 25 × 0.8 × 1 / 1 = 20. Stratum C (4, nothing drawn yet):
    4 × the pooled mean 2 = 8, variance 16 × 1 / 3. Total 38 ± 1.645 × √105.333333 = ± 16.882969."""
    total = stratified_total([(10, [D(1), D(3)]), (5, [D(2)]), (4, [])])

    assert total.expected == D(38)
    assert close(total.high - total.expected, "16.882969")


def test_nothing_measured_projects_nothing_and_the_low_end_is_never_below_zero():
    assert stratified_total([(10, [])]) is None
    assert stratified_total([(1000, [D(0), D(10)])]).low == 0


@pytest.mark.parametrize(
    ("successes", "trials", "low", "high"),
    [
        (1, 4, "0.057901", "0.643860"),
        (2, 3, "0.253510", "0.921743"),
        (0, 10, "0.000000", "0.212972"),
        (10, 10, "0.787028", "1.000000"),
        (45, 50, "0.808453", "0.950474"),
    ],
)
def test_wilsons_interval_at_90_percent(successes, trials, low, high):
    share = wilson(successes, trials)
    assert share.expected == D(successes) / trials
    assert close(share.low, low) and close(share.high, high)


def test_no_trials_is_no_share():
    assert wilson(0, 0) is None


@pytest.mark.parametrize(
    ("count", "low_rank", "high_rank"),
    [
        # P(Binomial(n, ½) < k) ≤ 5 %: n = 10, P(B ≤ 1) = 11/1024, P(B ≤ 2) = 56/1024 > 5 %: k = 2.
        (10, 2, 9),
        # n = 20: P(B ≤ 5) = 2.07 %, P(B ≤ 6) = 5.77 %: k = 6.
        (20, 6, 15),
        # n = 5: P(B ≤ 0) = 1/32: k = 1, the smallest and the largest; fewer than 5, the same.
        (5, 1, 5),
        (3, 1, 3),
        (1, 1, 1),
    ],
)
def test_the_medians_interval_is_made_of_order_statistics(count, low_rank, high_rank):
    values = [D(10 * n) for n in range(count, 0, -1)]  # 10, 20, … given largest first
    found = median_range(values)
    assert (found.low, found.high) == (D(10 * low_rank), D(10 * high_rank))
    assert found.expected == D(10 * (count + 1)) / 2


def observations(**given) -> Observations:
    return Observations(**given)


def test_the_projection_of_a_small_known_pilot():
    """Two strata. A: 20 products; first drafts 1 and 3 (mean 2); 4 first drafts settled, 2 usable
    (p = 0.5); 2 redrafts, 1 usable (r = 0.5): redrafts per product 0.5 × (1 + 0.5 + 0.25) = 0.875,
    still unusable 0.5 × 0.5³ = 0.0625. B: 10 products; 2 and 2; 4 of 4 usable, no redraft measured
    (r = p = 1): none. First pass 20 × 2 + 10 × 2 = 60, ± 1.645 × √(20² × 0.9 × 2 / 2) = ± 31.211681;
    reprocessing 20 × 2 × 0.875 = 35; in all 95. Decisions: A 20 × 1.875 × (1 − 1/5) = 30, B 10 × 1 ×
    (1 − 1/5) = 8: 38 at the median 90 s, 0.95 hours. Revisions 0.1 × 60 = 6 a month, beside the cost.
    The full job leaves out A's 3 and B's 4 approved products: 17 × 2 × 1.875 + 6 × 2 = 75.75."""
    first = observations(
        first_draft_costs=[D(1), D(3)],
        first_drafts_settled=4,
        first_drafts_usable=2,
        redrafts_settled=2,
        redrafts_usable=1,
        approved_items=3,
        judged=5,
        invalid=1,
        approvals=3,
        rejections=1,
        decision_seconds=[D(60), D(90), D(120), D(80)],
    )
    second = observations(
        first_draft_costs=[D(2), D(2)],
        first_drafts_settled=4,
        first_drafts_usable=4,
        approved_items=4,
        judged=5,
        invalid=1,
        approvals=3,
        rejections=1,
        decision_seconds=[D(100), D(90), D(85), D(200)],
    )

    projected = project(
        [(20, first), (10, second)],
        price_known=True,
        revisions_per_product_per_month=D("0.1"),
        provider_seconds_per_request=D(2),
        unit_size=12,
    )

    assert projected.scope_products == 30
    a, b = projected.strata
    assert (a.first_draft_usable.expected, a.redraft_usable.expected) == (D("0.5"), D("0.5"))
    assert a.redrafts_per_product.expected == D("0.875") and a.still_unusable.expected == D("0.0625")
    assert (b.redraft_usable, b.redrafts_measured) == (b.first_draft_usable, 0)
    assert b.redrafts_per_product.expected == 0
    assert projected.first_pass.expected == 60
    assert close(projected.first_pass.high, "91.211681")
    assert projected.reprocessing.expected == 35
    assert projected.cost.expected == 95
    assert projected.rest_cost.expected == D("75.75")
    assert projected.regeneration_from_revisions.expected == 6
    assert projected.wasted(a).expected == D("37.5")  # 20 × 2 × (0.875 + 0.0625)
    assert not a.at_risk and not b.at_risk
    assert projected.decisions.expected == 38
    assert projected.seconds_per_decision.expected == 90  # the median of the 8 decisions
    assert projected.review_hours.expected == D("0.95")
    # Units side by side at the provider: a unit of the job's 12 requests at 2 s each; or all 30 in a row.
    assert projected.provider_hours == D(24) / 3600
    assert projected.provider_hours_one_after_another == D(60) / 3600
    # Each low end is below its expected value, each high end above.
    for name in ("first_pass", "reprocessing", "cost", "rest_cost", "decisions", "review_hours"):
        value = getattr(projected, name)
        assert value.low <= value.expected <= value.high, name


# A pilot with a price, no revisions and no timed unit; its decisions took 30 s each.
ARGUMENTS = dict(
    price_known=True, revisions_per_product_per_month=D(0), provider_seconds_per_request=None, unit_size=10
)


@pytest.mark.parametrize(
    ("first", "redraft", "redrafts", "staying"),
    [
        # 0.8 × (1 + 0.5 + 0.25) redrafts; 0.8 × 0.5³ stay unusable.
        ("0.2", "0.5", "1.4", "0.1"),
        ("1", "0", "0", "0"),
        ("0", "0", "3", "1"),  # every draft fails: the cap, and every product stays unusable
        ("0", "1", "1", "0"),  # one redraft fixes it
        ("0.5", "0.2", "1.22", "0.256"),  # 0.5 × (1 + 0.8 + 0.64), 0.5 × 0.512
    ],
)
def test_redrafts_until_one_is_usable_at_most_three(first, redraft, redrafts, staying):
    assert MAX_REDRAFTS == 3
    assert redrafts_per_product(D(first), D(redraft)) == D(redrafts)
    assert still_unusable(D(first), D(redraft)) == D(staying)


def test_a_measured_redraft_rate_is_the_strata_own_and_without_one_its_first_drafts():
    """Furniture's first drafts are usable 1 time in 10: with its redrafts measured usable 9 times in
    10 it needs fewer redrafts than when a redraft is assumed as bad as a first draft."""
    measured = observations(
        first_draft_costs=[D(1)] * 10,
        first_drafts_settled=10,
        first_drafts_usable=1,
        redrafts_settled=10,
        redrafts_usable=9,
        judged=20,
        approvals=10,
        rejections=10,
        decision_seconds=[D(30)],
    )
    assumed = observations(
        first_draft_costs=[D(1)] * 10,
        first_drafts_settled=10,
        first_drafts_usable=1,
        judged=10,
        approvals=1,
        decision_seconds=[D(30)],
    )

    [with_redrafts] = project([(100, measured)], **ARGUMENTS).strata
    [without] = project([(100, assumed)], **ARGUMENTS).strata

    assert with_redrafts.redraft_usable.expected == D("0.9")
    assert close(with_redrafts.redrafts_per_product.expected, "0.999000")  # 0.9 × (1 + 0.1 + 0.01)
    assert without.redraft_usable == without.first_draft_usable
    assert close(without.redrafts_per_product.expected, "2.439000")  # 0.9 × (1 + 0.9 + 0.81)
    assert without.still_unusable.expected > RISK_SHARE and without.at_risk


def test_a_stratum_with_nothing_measured_borrows_the_pooled_share_with_a_wider_range():
    seen = observations(
        first_draft_costs=[D(1)] * 20,
        first_drafts_settled=20,
        first_drafts_usable=10,
        judged=20,
        approvals=10,
        decision_seconds=[D(30)],
    )

    measured, unmeasured = project([(100, seen), (50, observations())], **ARGUMENTS).strata

    assert unmeasured.first_draft_usable.expected == measured.first_draft_usable.expected == D("0.5")
    assert unmeasured.first_draft_usable.low < measured.first_draft_usable.low
    assert unmeasured.first_draft_usable.high > measured.first_draft_usable.high
    assert unmeasured.draft_cost.mean == 1  # the pooled mean


def test_without_a_price_the_projection_has_no_cost_but_still_its_hours():
    seen = observations(judged=1, approvals=1, decision_seconds=[D(36)])
    projected = project(
        [(100, seen)],
        price_known=False,
        revisions_per_product_per_month=D(0),
        provider_seconds_per_request=None,
        unit_size=5_000,
    )
    assert projected.cost is None and projected.first_pass is None and projected.rest_cost is None
    assert projected.review_hours.expected == 1  # 100 decisions × 36 s
    assert projected.provider_hours is None


@pytest.mark.parametrize(
    ("before", "after", "distance"),
    [
        ("a sturdy oak board", "a solid oak board", 1),
        ("a sturdy oak board", "a sturdy oak board", 0),
        ("a sturdy oak board", "a sturdy board", 1),
        ("a sturdy oak board", "sturdy oak board for bread", 3),
        ("", "three new words", 3),
    ],
)
def test_an_edit_is_measured_in_words_changed(before, after, distance):
    assert word_edit_distance(before, after) == distance


@pytest.mark.parametrize(
    ("made", "waiting", "needed"),
    [
        (0, 100, 30),  # 30 decided drafts in all
        (29, 100, 1),
        (30, 100, 0),
        (45, 3, 0),
        (4, 6, 6),  # a smaller pilot: every draft decided
        (4, 0, 0),
        (0, 0, 30),  # nothing decided and nothing coming: 30 are still needed
    ],
)
def test_when_enough_is_decided_to_project(made, waiting, needed):
    seen = observations(approvals=made, waiting=waiting)
    assert decisions_needed(seen) == Decisions(made, needed)


@pytest.mark.django_db
def test_a_reviewers_decisions_are_timed_from_their_previous_one_when_the_drafts_came_together(owner):
    """Drafts that arrive together wait for the reviewer: the second decision took the seconds since
    the first, not since its draft arrived (a measured pilot projected 15 times the review hours)."""
    for n in range(3):
        ProductFactory(sku=f"T-{n}", revision__fields={"category": "tools"})
    job = create_job(
        reference="timed",
        owner=owner,
        task="product_description",
        provider="emulator",
        model="gpt-4o-mini",
        pilot=PilotPlan(per_stratum=3, strata=("category",), seed=1),
    )
    items = list(job.items.order_by("id"))
    with clock_at(SHOWN_AT):
        drafts = [draft(item, 1000, 1000) for item in items]
    for item, version, seconds in zip(items, drafts, (10, 25, 45), strict=True):
        with clock_at(SHOWN_AT + timedelta(seconds=seconds)):
            if seconds == 25:
                reject_version(item_id=item.pk, version_id=version.pk, reviewer=owner, reason="vague")
            else:
                approve_version(
                    item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=owner
                )

    [seen] = observe(Pilot.objects.get(job=job), None).values()

    assert sorted(seen.decision_seconds) == [D(10), D(15), D(20)]


@pytest.mark.django_db
def test_each_draft_counts_as_usable_or_not_first_drafts_and_redrafts_apart(owner):
    """Four products of one stratum. A: invalid, redrafted, approved. B: rejected, redrafted, rejected.
    C: approved at once. D: waiting for a decision. First drafts: 3 settled (A's, B's, C's), 1 usable;
    redrafts: 2 settled, 1 usable; 2 products approved."""
    for n in range(4):
        ProductFactory(sku=f"U-{n}", revision__fields={"category": "tools"})
    job = create_job(
        reference="redrafted",
        owner=owner,
        task="product_description",
        provider="emulator",
        model="gpt-4o-mini",
        pilot=PilotPlan(per_stratum=4, strata=("category",), seed=1),
    )
    a, b, c, d = job.items.select_related("product").order_by("product__sku")
    draft(a, 100, 50, valid=False)
    retry_inference(a.pk, reason="Redraft")
    redraft = draft(a, 100, 50)
    approve_version(item_id=a.pk, version_id=redraft.pk, version_hash=redraft.content_hash, approver=owner)
    first = draft(b, 100, 50)
    reject_version(item_id=b.pk, version_id=first.pk, reviewer=owner, reason="vague")
    retry_inference(b.pk, reason="Redraft")
    second = draft(b, 100, 50)
    reject_version(item_id=b.pk, version_id=second.pk, reviewer=owner, reason="vague still")
    only = draft(c, 100, 50)
    approve_version(item_id=c.pk, version_id=only.pk, version_hash=only.content_hash, approver=owner)
    draft(d, 100, 50)

    [seen] = observe(Pilot.objects.get(job=job), None).values()

    assert (seen.first_drafts_settled, seen.first_drafts_usable) == (3, 1)
    assert (seen.redrafts_settled, seen.redrafts_usable) == (2, 1)
    assert seen.approved_items == 2
