"""A pilot's report (SPEC §6 `GET /api/jobs/{id}/pilot`, §8 `/jobs/{id}/pilot`): the sample by
stratum, what was measured per stratum and in all, and the projection for the whole scope with its
90 % range, in the business currency (`ledger.money.currency`: converted at today's rate; with no rate in force,
in USD, and `currency` says so).

The projection waits for enough decisions: MIN_DECISIONS decided drafts in all, or, in a smaller
pilot, every draft decided (nothing at the model and nothing waiting for a reviewer, at least one
decision). Until then `decisions.needed` says how many more it needs at most.
"""

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from functools import cached_property

from ..models import Job, Pilot, PilotDecision, PilotStratum
from ..money.currency import PROVIDER_CURRENCY, business_currency, convert, rate_now
from ..money.labour import review_hourly_rate
from ..money.pricing import price_for, unknown_price
from .accuracy import accuracy, decision_json
from .comparison import arm_preference_json, interval_json, pairs_json, preferences_between
from .drill_report import drill_report
from .measure import (
    Observations,
    RevisionHistory,
    failure_label,
    observe,
    provider_seconds_per_request,
    revision_history,
)
from .projection import (
    ALWAYS_FAILS,
    CONFIDENCE,
    MAX_REDRAFTS,
    RISK_SHARE,
    RISK_WORDS,
    STAYS_UNUSABLE,
    Projection,
    Range,
    StratumProjection,
    Z,
    median_range,
    project,
)

MIN_DECISIONS = 30
MONEY_PLACES = Decimal("0.000001")
HOURS_PLACES = Decimal("0.01")
RATE_PLACES = Decimal("0.0001")


def pilot_of(job: Job) -> Pilot | None:
    return Pilot.objects.filter(job=job).first()


@dataclass(frozen=True)
class Decisions:
    made: int
    needed: int

    @property
    def enough(self) -> bool:
        return self.needed == 0


def decisions_needed(seen: Observations) -> Decisions:
    """How many more decisions the projection needs (module docstring): each item still at the model
    or waiting for a reviewer may bring one."""
    made = seen.decisions
    if made >= MIN_DECISIONS or (made and not seen.waiting):
        return Decisions(made, 0)
    short = MIN_DECISIONS - made
    return Decisions(made, min(short, seen.waiting) if seen.waiting else short)


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _per(amount, count: int, places: int = 1) -> float | None:
    return round(float(amount) / count, places) if count else None


class Report:
    """The report of one pilot, read once from the ledger."""

    def __init__(self, pilot: Pilot):
        self.pilot = pilot
        self.job = pilot.job
        self.price = price_for(self.job.provider, self.job.model)
        self.rate = rate_now()
        self.strata: list[PilotStratum] = list(pilot.strata_drawn.order_by("number"))
        self.by_stratum = observe(pilot, self.price)
        self.all = Observations()
        for observations in self.by_stratum.values():
            self.all.add(observations)
        self.decisions = decisions_needed(self.all)

    @property
    def currency(self) -> str:
        return business_currency() if self.rate is not None else PROVIDER_CURRENCY

    def money(self, usd: Decimal | None) -> Decimal | None:
        if usd is None:
            return None
        return (usd if self.rate is None else convert(usd, self.rate)).quantize(MONEY_PLACES)

    def money_range(self, usd: Range | None) -> dict | None:
        if usd is None:
            return None
        return {
            "expected": self.money(usd.expected),
            "low": self.money(usd.low),
            "high": self.money(usd.high),
            "currency": self.currency,
            "provider": {
                "expected": usd.expected.quantize(MONEY_PLACES),
                "low": usd.low.quantize(MONEY_PLACES),
                "high": usd.high.quantize(MONEY_PLACES),
                "currency": PROVIDER_CURRENCY,
            },
        }

    def measured(self, seen: Observations) -> dict:
        seconds = median_range(seen.decision_seconds)
        return {
            "items": seen.items,
            "drafted_items": seen.drafted_items,
            "drafts": seen.drafts,
            "tokens_in_per_item": _per(seen.input_tokens, seen.drafted_items),
            "tokens_out_per_item": _per(seen.output_tokens, seen.drafted_items),
            "cost_per_item": (
                self.money(seen.cost / seen.drafted_items)
                if seen.cost is not None and seen.drafted_items
                else None
            ),
            "currency": self.currency,
            "validation_failure_rate": _share(seen.invalid, seen.judged),
            "validation_failures": [
                {"code": code, "label": failure_label(code), "drafts": count}
                for code, count in sorted(
                    seen.failures_by_reason.items(), key=lambda pair: (-pair[1], pair[0])
                )
            ],
            "decisions": seen.decisions,
            "approvals": seen.approvals,
            "rejections": seen.rejections,
            "acceptance_rate": _share(seen.approvals, seen.decisions),
            "edit_rate": _share(seen.edited, seen.approvals),
            "edit_distance_words": _per(sum(seen.edit_distances), len(seen.edit_distances)),
            "seconds_per_decision": round(float(seconds.expected), 1) if seconds else None,
            "retries": seen.retries,
            "regenerations": seen.regenerations,
            "obsolete_items": seen.obsolete,
            "reprocessing_rate": _share(seen.reprocessed_items, seen.items),
            "waiting": seen.waiting,
        }

    def sample(self) -> dict:
        strata = [
            {
                "key": stratum.label,
                "number": stratum.number,
                "values": stratum.values,
                "scope_products": stratum.scope_products,
                "products": stratum.sample_products,
                "items": self.by_stratum[stratum.number].items,
                "measured": self.measured(self.by_stratum[stratum.number]),
            }
            for stratum in self.strata
        ]
        return {
            "scope_products": sum(stratum.scope_products for stratum in self.strata),
            "products": sum(stratum.sample_products for stratum in self.strata),
            "items": self.all.items,
            "strata": strata,
        }

    @cached_property
    def projection(self) -> tuple[Projection, RevisionHistory] | None:
        """None until enough drafts are decided."""
        if not self.decisions.enough:
            return None
        history = revision_history(self.pilot)
        return (
            project(
                [(stratum.scope_products, self.by_stratum[stratum.number]) for stratum in self.strata],
                price_known=self.price is not None,
                revisions_per_product_per_month=history.per_product_per_month,
                provider_seconds_per_request=provider_seconds_per_request(self.pilot),
                unit_size=self.job.unit_size,
            ),
            history,
        )

    def projection_json(self) -> dict | None:
        found = self.projection
        if found is None:
            return None
        projected, history = found
        first_pass, reprocessing = projected.first_pass, projected.reprocessing
        cost = self.money_range(projected.cost)
        if cost is not None:
            cost |= {
                "first_pass": self.money_range(first_pass),
                "reprocessing": self.money_range(reprocessing),
            }
            # The total is its parts' sum as shown, to the last digit (each is rounded to MONEY_PLACES).
            cost["expected"] = cost["first_pass"]["expected"] + cost["reprocessing"]["expected"]
            cost["provider"]["expected"] = (
                cost["first_pass"]["provider"]["expected"] + cost["reprocessing"]["provider"]["expected"]
            )
        review_cost = self.review_cost(projected.review_hours)
        return {
            "scope_items": projected.scope_products,
            "confidence": float(CONFIDENCE),
            "cost": cost,
            # The first pass and the reprocessing, under the names they had before issue 27.
            "inference_cost": self.money_range(first_pass),
            "regeneration_cost": self.money_range(reprocessing),
            "regeneration": {
                "from_failures": self.money_range(reprocessing),
                "from_revisions_per_month": self.money_range(projected.regeneration_from_revisions),
                "unusable_share": figures(projected.unusable_share, RATE_PLACES),
                "still_unusable_share": figures(projected.still_unusable, RATE_PLACES),
                "max_redrafts": MAX_REDRAFTS,
                "revisions_per_product_per_month": round(float(projected.revisions_per_product_per_month), 4),
                "revision_history": {
                    "revisions": history.revisions,
                    "products": history.products,
                    "from": history.since,
                    "to": history.until,
                    "months": round(float(history.months), 2),
                },
            },
            "strata": [
                self.stratum_json(stratum, projected_stratum)
                for stratum, projected_stratum in zip(self.strata, projected.strata, strict=True)
            ],
            "validation_failure_rate": figures(projected.invalid_rate, RATE_PLACES),
            "acceptance_rate": figures(projected.acceptance_rate, RATE_PLACES),
            "decisions": figures(projected.decisions, Decimal(1)),
            "seconds_per_decision": figures(projected.seconds_per_decision, Decimal("0.1")),
            "review_hours": figures(projected.review_hours, HOURS_PLACES),
            "review_cost": review_cost,
            "review_cost_note": None if review_cost else REVIEW_UNPRICED,
            "whole_workflow": self.whole_workflow(projected, review_cost),
            "provider_hours": hours(projected.provider_hours),
            "provider_hours_one_after_another": hours(projected.provider_hours_one_after_another),
            "method": METHOD,
        }

    def stratum_json(self, stratum: PilotStratum, projected: StratumProjection) -> dict:
        return {
            "key": stratum.label,
            "number": stratum.number,
            "scope_products": projected.products,
            "approved_in_pilot": projected.approved_in_pilot,
            "first_draft_usable": figures(projected.first_draft_usable, RATE_PLACES),
            "redraft_usable": figures(projected.redraft_usable, RATE_PLACES),
            "redrafts_measured": projected.redrafts_measured,
            "redrafts_per_product": figures(projected.redrafts_per_product, RATE_PLACES),
            "still_unusable_share": figures(projected.still_unusable, RATE_PLACES),
            "cost": self.money_range(projected.cost),
        }

    def review_cost(self, review_hours: Range) -> dict | None:
        """Review hours at `BATCHDESK_REVIEW_HOURLY_RATE`, in the business currency; None when unset."""
        rate = review_hourly_rate()
        if rate is None:
            return None
        return {
            "expected": (review_hours.expected * rate).quantize(MONEY_PLACES),
            "low": (review_hours.low * rate).quantize(MONEY_PLACES),
            "high": (review_hours.high * rate).quantize(MONEY_PLACES),
            "currency": business_currency(),
            "hourly_rate": rate,
        }

    def whole_workflow(self, projected: Projection, review_cost: dict | None) -> dict | None:
        """The pilot's spend so far, the full job's projected cost (the scope without the products
        whose pilot draft was approved) and, when priced in the same currency, the review."""
        rest = projected.rest_cost
        if rest is None or self.all.cost is None:
            return None
        pilot_spend = self.money(self.all.cost)
        ends = {end: pilot_spend + self.money(getattr(rest, end)) for end in ("expected", "low", "high")}
        with_review = review_cost is not None and review_cost["currency"] == self.currency
        if with_review:
            ends = {end: amount + review_cost[end] for end, amount in ends.items()}
        return {
            **ends,
            "currency": self.currency,
            "pilot_spend": pilot_spend,
            "rest": self.money_range(rest),
            "products_left_out": sum(stratum.approved_in_pilot for stratum in projected.strata),
            "includes_review": with_review,
        }

    def risks(self) -> list[dict] | None:
        """The strata whose products would stay unusable (`StratumProjection.at_risk`), with the money
        spent on their unusable drafts; None until the report can project."""
        found = self.projection
        if found is None:
            return None
        projected, _ = found
        risks = []
        for stratum, seen in zip(self.strata, projected.strata, strict=True):
            if not seen.at_risk:
                continue
            wasted = projected.wasted(seen)
            amount = self.money(wasted.expected) if wasted else None
            staying = seen.still_unusable.expected
            kind = ALWAYS_FAILS if seen.always_failed else STAYS_UNUSABLE
            staying_products = round(seen.products * staying)
            risks.append(
                {
                    "stratum": stratum.label,
                    "kind": kind,
                    "message": RISK_WORDS[kind].format(
                        stratum=stratum.label,
                        products=seen.products,
                        share=f"{100 * staying:.0f} %",
                        staying=staying_products,
                        redrafts=MAX_REDRAFTS,
                        amount=f"{self.currency} {shown(amount)}"
                        if amount is not None
                        else "an unknown amount",
                    ),
                    "amount": amount,
                    "currency": self.currency,
                    "products": seen.products,
                    "products_staying_unusable": staying_products,
                    "still_unusable_share": figures(seen.still_unusable, RATE_PLACES),
                }
            )
        return risks

    def as_json(self) -> dict:
        pilot = self.pilot
        return {
            "job": {"id": self.job.pk, "reference": self.job.reference, "state": self.job.state},
            "pilot": {
                "per_stratum": pilot.per_stratum,
                "strata": pilot.strata,
                "seed": pilot.seed,
                "drill": pilot.drill,
                "arms": pilot.arms,
                "same_sample": pilot.same_sample,
                "scope": scope_words(pilot),
                "drawn_at": pilot.drawn_at,
            },
            "currency": self.currency,
            "rate": self.rate.as_json() if self.rate else None,
            "price_known": self.price is not None,
            "price_note": self.price.note if self.price else unknown_price(self.job.provider, self.job.model),
            "decisions": {
                "made": self.decisions.made,
                "needed": self.decisions.needed,
                "threshold": MIN_DECISIONS,
            },
            "sample": self.sample(),
            "measured": self.measured(self.all),
            "projection": self.projection_json(),
            "risks": self.risks(),
            "drill": drill_report(pilot),
            **self.arms_compared(),
            **self.what_followed(),
        }

    def what_followed(self) -> dict:
        """The decision on the report and how its projection held (`ledger.pilots.accuracy`)."""
        decision = (
            PilotDecision.objects.filter(pilot=self.pilot).select_related("by", "full_job", "pilot").first()
        )
        measured, note = accuracy(decision, self)
        return {"decision": decision_json(decision), "accuracy": measured, "accuracy_note": note}

    def arms_compared(self) -> dict:
        """A pilot of several arms: `arms`, each arm's settings and what it showed side by side, cost
        per approved draft (its whole spend over its approved drafts, so waste raises it) and acceptance
        first (issue 19), acceptance and blind preference with their 95 % intervals; `arm_pairs`, each
        two arms' difference, whether it is told apart from chance and, if not, how many more decisions
        would settle it (`ledger.pilots.comparison`, issue 30). Both None for a pilot of one arm."""
        if self.pilot.arms <= 1:
            return {"arms": None, "arm_pairs": None}
        first = self.pilot.first_arm or self.pilot
        group = [first, *first.other_arms.select_related("job__prompt_version").order_by("arm")]
        tallies = preferences_between(first)
        rows = []
        for arm in group:
            report = self if arm.pk == self.pilot.pk else Report(arm)
            seen = report.all
            cost = seen.cost
            rows.append(
                {
                    "arm": arm.arm,
                    "job": {"id": arm.job_id, "reference": arm.job.reference},
                    "provider": arm.job.provider,
                    "model": arm.job.model,
                    "prompt_version": arm.job.prompt_version.version,
                    "items": seen.items,
                    "decisions": seen.decisions,
                    "approvals": seen.approvals,
                    "acceptance_rate": _share(seen.approvals, seen.decisions),
                    "validation_failure_rate": _share(seen.invalid, seen.judged),
                    "cost": report.money(cost) if cost is not None else None,
                    "cost_per_approved_draft": (
                        report.money(cost / seen.approvals) if cost is not None and seen.approvals else None
                    ),
                    "currency": report.currency,
                    "acceptance": interval_json(seen.approvals, seen.decisions),
                    "preference": arm_preference_json(arm.arm, tallies),
                }
            )
        return {"arms": rows, "arm_pairs": pairs_json(tallies, rows)}


def hours(value: Decimal | None) -> float | None:
    return float(value.quantize(HOURS_PLACES)) if value is not None else None


def figures(value: Range, places: Decimal) -> dict:
    """A range of numbers that are not money, rounded to `places`, as JSON numbers."""
    return {
        name: float(getattr(value, name).quantize(places, rounding=ROUND_HALF_UP))
        for name in ("expected", "low", "high")
    }


def shown(amount: Decimal) -> Decimal:
    """An amount in a sentence: to the penny, or to four places under a pound, where pennies would
    hide it."""
    return amount.quantize(Decimal("0.01") if abs(amount) >= 1 else Decimal("0.0001"), rounding=ROUND_HALF_UP)


def scope_words(pilot: Pilot) -> str:
    if pilot.scope_skus is None:
        return "every active product"
    return f"{len(pilot.scope_skus):,} SKUs named"


REVIEW_UNPRICED = (
    "Review is unpriced: set BATCHDESK_REVIEW_HOURLY_RATE (the business currency per hour of review) to "
    "turn the review hours into money."
)

METHOD = (
    "Every measure is each stratum's own, weighted by its share of the scope. First pass: one draft for "
    "every product of the scope (the pilot's products included), Σ over strata of the scope's products × "
    "the mean cost of the first drafts drawn there. Reprocessing: a product whose draft is unusable "
    "(failed validation, or rejected) is drafted again at its stratum's cost of a draft until one is usable, "
    f"at most {MAX_REDRAFTS} redrafts; each stratum's first drafts' usable share and its redrafts' usable "
    "share are measured on the pilot's drafts (a stratum whose redrafts were not measured takes its first "
    "drafts' usable share as a redraft's; a stratum with nothing measured, the pilot's pooled share with "
    f"the interval of a single observation). Products still unusable after {MAX_REDRAFTS} redrafts stay "
    f"unusable; a stratum with {RISK_SHARE:.0%} or more of them, or whose every measured draft was "
    "unusable, is named among the risks with what its unusable drafts would cost. Ranges: 90 %, Wilson's "
    f"interval (z = {Z}) for each stratum's rates and ± {Z} × the standard error of its mean cost (with the "
    "finite-population correction); a stratum's parts and the strata combine as independent errors (square "
    "root of the sum of squares), so a total's ends are not the sums of its parts' ends. A month of the "
    "catalogue's revisions, each drafting its product again, is shown beside the cost, not in it. Review "
    "hours: a decision for every valid draft (first drafts and redrafts) at the median seconds a pilot "
    "decision took (from the draft shown to the decision, or from the same reviewer's previous decision "
    "when that came later), its range from the rates' ends and the median's order-statistic 90 % interval; "
    "review cost: those hours at BATCHDESK_REVIEW_HOURLY_RATE. Whole workflow: the pilot's spend so far (its "
    "drafts at the batch price) + the projected cost of the full job, which leaves out the products whose "
    "pilot draft was approved (its ends combined as above), + the review cost when priced. Provider hours: "
    "the provider runs the scope's units side by side, each as long as one of the job's unit size takes at "
    "the seconds per request the pilot's units took from sending to collection; "
    "provider_hours_one_after_another: every request in a row, the most it could take."
)
