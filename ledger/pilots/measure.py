"""What a pilot's own run shows (issue 19, point 3), per stratum and in all: tokens and cost per item,
validation failures by reason, acceptance, edits, time to decide, retries and obsolete items; and, for
the projection, the provider's time per request and how often the scope's products are revised.

Read from the ledger as it is: the pilot's items (its sample's, and any that replaced an obsolete
one), their drafts, events and approvals. A pilot holds at most `sample.MAX_SAMPLE` products, so its
rows are read into Python and counted here, where each rule is written once and plainly.
"""

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Min
from django.utils import timezone

from ..database.setwise import among
from ..models import (
    Approval,
    Event,
    GeneratedVersion,
    Item,
    Pilot,
    PilotProduct,
    Product,
    ProductStatus,
    SourceRevision,
    Submission,
)
from ..money.pricing import Price
from ..states import DECIDABLE_STATES, OUTSTANDING_STATES, ItemState, ReasonCode, SubmissionState

# An item in one of these waits for the model or for a reviewer: its next draft may need a decision.
WAITING_STATES = frozenset({*OUTSTANDING_STATES, ItemState.AWAITING_REVIEW})
# A failure recorded before its event kept the reasons' codes, whose item has moved on since.
UNCLASSIFIED = "unclassified"
# How far back the catalogue's history is read for revisions per month.
REVISION_HISTORY = timedelta(days=365)
DAYS_PER_MONTH = Decimal("30.4375")  # 365.25 / 12


@dataclass
class Observations:
    """What the pilot's items of one stratum (or of all) show. Costs are USD at the job's batch
    price; None when the model has no known price."""

    items: int = 0
    drafted_items: int = 0  # items with at least one draft
    drafts: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal | None = Decimal(0)  # every draft's
    first_draft_costs: list[Decimal] = field(default_factory=list)  # one per drafted item
    judged: int = 0  # drafts validated
    invalid: int = 0
    failures_by_reason: Counter = field(default_factory=Counter)
    approvals: int = 0
    rejections: int = 0
    edited: int = 0
    edit_distances: list[int] = field(default_factory=list)  # words changed, per edited approval
    decision_seconds: list[Decimal] = field(default_factory=list)
    retries: int = 0  # inferences asked again after a failure
    regenerations: int = 0  # drafts after an item's first
    # Drafts whose use is known (`usable_draft`'s rule), first drafts and redrafts apart.
    first_drafts_settled: int = 0
    first_drafts_usable: int = 0
    redrafts_settled: int = 0
    redrafts_usable: int = 0
    approved_items: int = 0  # items with an approved draft
    obsolete: int = 0
    reprocessed_items: int = 0  # retried, regenerated or obsolete
    waiting: int = 0  # items at the model or waiting for a decision

    @property
    def decisions(self) -> int:
        return self.approvals + self.rejections

    def add(self, other: "Observations") -> None:
        for name in (
            "items",
            "drafted_items",
            "drafts",
            "input_tokens",
            "output_tokens",
            "judged",
            "invalid",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in (
            "approvals",
            "rejections",
            "edited",
            "retries",
            "regenerations",
            "obsolete",
            "first_drafts_settled",
            "first_drafts_usable",
            "redrafts_settled",
            "redrafts_usable",
            "approved_items",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.reprocessed_items += other.reprocessed_items
        self.waiting += other.waiting
        self.cost = None if self.cost is None or other.cost is None else self.cost + other.cost
        self.first_draft_costs += other.first_draft_costs
        self.failures_by_reason += other.failures_by_reason
        self.edit_distances += other.edit_distances
        self.decision_seconds += other.decision_seconds


def word_edit_distance(before: str, after: str) -> int:
    """Words inserted, deleted or replaced to make `after` from `before` (Levenshtein over words),
    after the words both share at their start and end, where edits seldom are."""
    a, b = before.split(), after.split()
    while a and b and a[0] == b[0]:
        a, b = a[1:], b[1:]
    while a and b and a[-1] == b[-1]:
        a, b = a[:-1], b[:-1]
    previous = list(range(len(b) + 1))
    for i, word in enumerate(a, 1):
        current = [i]
        for j, other in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (word != other)))
        previous = current
    return previous[-1]


def observe(pilot: Pilot, price: Price | None) -> dict[int, Observations]:
    """The pilot's observations by stratum number."""
    job_id = pilot.job_id
    stratum_of_product = dict(
        PilotProduct.objects.filter(pilot=pilot).values_list("product_id", "stratum").order_by()
    )
    by_stratum = {number: Observations() for number in pilot.strata_drawn.values_list("number", flat=True)}
    stratum_of: dict[int, int] = {}
    state_of: dict[int, str] = {}
    reprocessed: set[int] = set()  # retried or obsolete; regenerated ones are found by their drafts
    failure_code: dict[int, str] = {}
    for item_id, product_id, state, attempt, code in (
        Item.objects.filter(job_id=job_id)
        .order_by()
        .values_list("id", "product_id", "state", "inference_attempt", "reason_code")
    ):
        seen = by_stratum[stratum_of_product[product_id]]
        stratum_of[item_id] = stratum_of_product[product_id]
        state_of[item_id] = state
        seen.items += 1
        seen.retries += attempt - 1
        seen.obsolete += state == ItemState.OBSOLETE
        seen.waiting += state in WAITING_STATES
        if attempt > 1 or state == ItemState.OBSOLETE:
            reprocessed.add(item_id)
        if state == ItemState.VALIDATION_FAILED:
            failure_code[item_id] = code
    drafts_of: dict[int, list[tuple[int, int, bool | None]]] = defaultdict(list)
    for version_id, item_id, number, input_tokens, output_tokens, valid in (
        GeneratedVersion.objects.filter(item__job_id=job_id)
        .order_by()
        .values_list("id", "item_id", "number", "input_tokens", "output_tokens", "valid")
    ):
        drafts_of[item_id].append((number, version_id, valid))
        seen = by_stratum[stratum_of[item_id]]
        seen.drafts += 1
        seen.input_tokens += input_tokens
        seen.output_tokens += output_tokens
        seen.judged += valid is not None
        seen.invalid += valid is False
        cost = price.cost(input_tokens, output_tokens) if price is not None else None
        seen.cost = None if seen.cost is None or cost is None else seen.cost + cost
        if number == 1:
            seen.drafted_items += 1
            if cost is not None:
                seen.first_draft_costs.append(cost)
        else:
            seen.regenerations += 1
            reprocessed.add(item_id)
    for item_id in reprocessed:
        by_stratum[stratum_of[item_id]].reprocessed_items += 1
    _observe_events(job_id, stratum_of, by_stratum, failure_code)
    approved: set[int] = set()
    for item_id, version_id, edited, draft, final in (
        Approval.objects.standing()
        .filter(item__job_id=job_id)
        .order_by()
        .values_list("item_id", "version_id", "edited", "version__content", "final_content")
    ):
        approved.add(version_id)
        seen = by_stratum[stratum_of[item_id]]
        seen.approvals += 1
        if edited:
            seen.edited += 1
            seen.edit_distances.append(word_edit_distance(draft, final))
    for item_id, drafts in drafts_of.items():
        _observe_use(by_stratum[stratum_of[item_id]], sorted(drafts), approved, state_of[item_id])
    return by_stratum


def usable_draft(valid: bool | None, approved: bool, last: bool, item_state: str) -> bool | None:
    """Whether a draft was usable: approved. Unusable: it failed validation, or was valid and not
    approved while a later draft followed it or its item now stands rejected. None while unknown
    (not judged yet, or waiting for a decision)."""
    if approved:
        return True
    if valid is False or (valid and (not last or item_state == ItemState.REJECTED)):
        return False
    return None


def _observe_use(
    seen: Observations, drafts: list[tuple[int, int, bool | None]], approved: set[int], item_state: str
) -> None:
    """An item's drafts, in number order, counted as usable or not: its first, and its redrafts."""
    any_usable = False
    for position, (number, version_id, valid) in enumerate(drafts):
        usable = usable_draft(valid, version_id in approved, position == len(drafts) - 1, item_state)
        if usable is None:
            continue
        any_usable |= usable
        if number == 1:
            seen.first_drafts_settled += 1
            seen.first_drafts_usable += usable
        else:
            seen.redrafts_settled += 1
            seen.redrafts_usable += usable
    seen.approved_items += any_usable


def _observe_events(
    job_id: int, stratum_of: dict[int, int], by_stratum: dict[int, Observations], failure_code: dict[int, str]
) -> None:
    """Rejections, validation failures by reason, and the seconds each decision took: from the event
    that put the draft before a person (awaiting review, or unusable for an edit that repairs it) to
    the approval or rejection; or from the same reviewer's previous decision when that came later: a
    pilot's drafts arrive together, and timed from their arrival alone the later ones' seconds were
    mostly their wait in the queue (a measured pilot projected 15 times the review hours)."""
    shown_at: dict[int, datetime] = {}
    decided_at: dict[int | None, datetime] = {}  # each reviewer's latest decision
    events = list(
        Event.objects.filter(
            item__job_id=job_id,
            to_state__in=[*DECIDABLE_STATES, ItemState.APPROVED, ItemState.REJECTED],
        )
        .order_by("at", "id")
        .values_list("pk", "item_id", "from_state", "to_state", "at", "data", "actor_id")
    )
    # A decision its reviewer undid is no decision; its undo puts the draft before a person again.
    undone = {data["undoes"] for *_, data, _ in events if data and "undoes" in data}
    for pk, item_id, from_state, to_state, at, data, actor in events:
        seen = by_stratum[stratum_of[item_id]]
        if to_state in DECIDABLE_STATES:
            shown_at[item_id] = at
        if pk in undone:
            continue
        if to_state == ItemState.VALIDATION_FAILED:
            if data and "undoes" in data:
                continue  # an undone repair: the draft's failure was counted when it was found
            codes = (data or {}).get("codes") or [failure_code.get(item_id) or UNCLASSIFIED]
            seen.failures_by_reason.update(set(codes))
        elif item_id in shown_at and from_state in DECIDABLE_STATES:
            seen.rejections += to_state == ItemState.REJECTED
            started = shown_at.pop(item_id)
            if actor is not None and actor in decided_at:
                started = max(started, decided_at[actor])
            decided_at[actor] = at
            seconds = (at - started).total_seconds()
            seen.decision_seconds.append(Decimal(str(round(seconds, 3))))


def failure_label(code: str) -> str:
    return (
        ReasonCode(code).label
        if code in ReasonCode.values
        else "Not classified (recorded before codes were kept)"
    )


def provider_seconds_per_request(pilot: Pilot) -> Decimal | None:
    """The provider's time per request in the pilot's own run: each collected unit's time from
    being sent to being collected, summed, over the requests they held. None before any is collected."""
    units = Submission.objects.filter(
        job_id=pilot.job_id, state=SubmissionState.COLLECTED, sent_at__isnull=False
    )
    collected = dict(
        Event.objects.filter(submission__in=units, to_state=SubmissionState.COLLECTED)
        .order_by()
        .values_list("submission_id")
        .annotate(at=Min("at"))
    )
    seconds, requests = Decimal(0), 0
    for pk, sent_at, sent in units.values_list("pk", "sent_at", "requests_sent"):
        if pk in collected and sent:
            seconds += Decimal(str((collected[pk] - sent_at).total_seconds()))
            requests += sent
    return seconds / requests if requests else None


@dataclass(frozen=True)
class RevisionHistory:
    """How often the scope's products are revised: revisions after each product's first, per product
    and month, over `since` to `until` (the last 12 months, or all the history when shorter; a
    history shorter than a month counts as one month)."""

    revisions: int
    products: int
    since: datetime | None
    until: datetime

    @property
    def months(self) -> Decimal:
        if self.since is None:
            return Decimal(1)
        return max(Decimal(1), Decimal((self.until - self.since).days) / DAYS_PER_MONTH)

    @property
    def per_product_per_month(self) -> Decimal:
        if not self.products:
            return Decimal(0)
        return Decimal(self.revisions) / self.products / self.months


def revision_history(pilot: Pilot) -> RevisionHistory:
    scope = Product.objects.filter(status=ProductStatus.ACTIVE)
    if pilot.scope_skus is not None:
        scope = scope.filter(among("sku", pilot.scope_skus))
    until = timezone.now()
    revisions = SourceRevision.objects.filter(product__in=scope)
    first = revisions.aggregate(first=Min("created_at"))["first"]
    since = max(first, until - REVISION_HISTORY) if first else None
    later = revisions.filter(number__gt=1, created_at__gte=since).count() if since else 0
    return RevisionHistory(revisions=later, products=scope.count(), since=since, until=until)
