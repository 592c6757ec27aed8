"""Operations (SPEC §8): what needs an operator, grouped by reason in business words, with single and
bulk retry, re-driving dead letters and resolving uncertain submissions.

Everyone sees the page; only operators (and admins) act. Every action goes through a ledger verb,
which checks the state again under a row lock, and reports per item what happened."""

import hashlib
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import BooleanField, Count, ExpressionWrapper, F, Min, Q, QuerySet
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.timesince import timesince
from django.views.decorators.http import require_GET, require_POST

from ledger.actions import (
    RESEND_RISK,
    NotAllowed,
    operator_must_decide,
    reconcile_uncertain,
    redrive_dead_letter,
    resend_uncertain,
    retry_item,
)
from ledger.models import Item, SourceRevision, Submission
from ledger.money.estimates import request_estimate, work_cost
from ledger.money.pricing import price_for
from ledger.providers import answers_at_once
from ledger.providers.base import ProviderError
from ledger.states import NEEDS_ATTENTION_STATES, ItemState, ReasonCode, SubmissionState

from .common import HtmxHttpRequest, wants_partial
from .display import shown_money_text
from .ids import parse_id
from .paging import screen_page
from .permissions import OPERATOR, VIEWERS, has_role, role_required

S = ItemState

INFERENCE, DESTINATION = "inference", "destination"
# Submissions that have not finished: to be sent, being reconciled, at the provider, or to be collected.
UNFINISHED_SUBMISSIONS = (
    SubmissionState.INTENT,
    SubmissionState.UNCERTAIN,
    SubmissionState.OPEN,
    SubmissionState.ENDED,
)
ITEMS_PER_PAGE = 25
SUBMISSIONS_PER_PAGE = 25
# One bulk round calls a ledger verb per item inside the request; larger groups take several rounds.
BULK_LIMIT = 500


def ago(moment: datetime | None, *, depth: int = 2) -> str:
    """How long ago, in words: "40 seconds ago", "2 hours, 5 minutes ago"; "never" for no time."""
    if moment is None:
        return "never"
    seconds = (timezone.now() - moment).total_seconds()
    if seconds < 60:
        return "just now" if seconds < 5 else f"{int(seconds)} seconds ago"
    return f"{timesince(moment, depth=depth)} ago"


# --- reasons in business words ---------------------------------------------------------------

# Groups whose reason adds nothing to the state (or is a reviewer's own words, shown per item).
ONE_GROUP_PER_STATE = {
    S.SUBMISSION_UNCERTAIN: "Unclear whether the provider received the batch",
    S.REJECTED: "Rejected by a reviewer",
}


def business_reason(state: str, code: str, *, applying: bool) -> str:
    """A group's words, from the item's state and its reason code; never from the reason's text."""
    if state in ONE_GROUP_PER_STATE:
        return ONE_GROUP_PER_STATE[state]
    words = ReasonCode(code).label if code in ReasonCode.values else "Other reasons (see each item)"
    if state == S.DEAD_LETTER:
        cause = "the destination kept failing" if applying else f"{words[0].lower()}{words[1:]}"
        return f"Gave up after the allowed attempts — {cause}"
    return words


def unit_for(state: str, *, applying: bool) -> str | None:
    """What a retry re-runs: the model, the destination, or nothing an operator can retry here."""
    if state in (S.INFERENCE_FAILED, S.VALIDATION_FAILED, S.REJECTED):
        return INFERENCE
    if state == S.DESTINATION_REJECTED:
        return DESTINATION
    if state == S.DEAD_LETTER:
        return DESTINATION if applying else INFERENCE
    return None


# --- groups --------------------------------------------------------------------------------


@dataclass
class Group:
    state: str
    label: str
    # A dead letter that gave up while applying re-drives to the destination, else to the model.
    applying: bool
    count: int
    oldest: datetime
    # The reason code it gathers (items of one state are found again by it).
    code: str
    # How many of its items each provider's jobs hold.
    by_provider: dict[str, int] = field(default_factory=dict)
    # Said before a bulk retry is confirmed: what asking again with the same prompt version means.
    warning: str = ""

    @property
    def key(self) -> str:
        return hashlib.sha256(f"{self.state}|{self.applying}|{self.code}".encode()).hexdigest()[:12]

    @property
    def oldest_ago(self) -> str:
        return ago(self.oldest, depth=1)

    @property
    def state_label(self) -> str:
        return ItemState(self.state).label

    @property
    def unit(self) -> str | None:
        return unit_for(self.state, applying=self.applying)

    @property
    def is_dead_letter(self) -> bool:
        return self.state == S.DEAD_LETTER

    @property
    def bulk_count(self) -> int:
        return min(self.count, BULK_LIMIT)

    def items(self) -> QuerySet[Item]:
        items = Item.objects.needs_attention().filter(state=self.state)
        if self.state not in ONE_GROUP_PER_STATE:
            items = items.filter(reason_code=self.code)
        if self.is_dead_letter:
            items = items.filter(approved_version__isnull=not self.applying)
        return items.select_related("product", "job__prompt_version", "submission").order_by(
            "updated_at", "id"
        )


def attention_groups() -> list[Group]:
    """One aggregate query by (state, reason code, applying, provider): each group is named in
    business words and counts its items per provider of their job."""
    rows = (
        Item.objects.needs_attention()
        .order_by()
        .values(
            "state",
            "reason_code",
            "job__provider",
            applying=ExpressionWrapper(Q(approved_version__isnull=False), output_field=BooleanField()),
        )
        .annotate(count=Count("id"), oldest=Min("updated_at"))
    )
    groups: dict[tuple[str, bool, str], Group] = {}
    for row in rows:
        state = row["state"]
        applying = state == S.DEAD_LETTER and row["applying"]
        code = "" if state in ONE_GROUP_PER_STATE else row["reason_code"]
        group = groups.get((state, applying, code))
        if group is None:
            label = business_reason(state, code, applying=applying)
            group = groups[(state, applying, code)] = Group(state, label, applying, 0, row["oldest"], code)
        group.count += row["count"]
        group.oldest = min(group.oldest, row["oldest"])
        provider = row["job__provider"]
        group.by_provider[provider] = group.by_provider.get(provider, 0) + row["count"]
    order = {state: n for n, state in enumerate(NEEDS_ATTENTION_STATES)}
    for group in groups.values():
        group.by_provider = dict(sorted(group.by_provider.items(), key=lambda pair: (-pair[1], pair[0])))
    return sorted(groups.values(), key=lambda g: (order[g.state], -g.count, g.label))


def providers_of(groups: list[Group]) -> list[tuple[str, int]]:
    """Items needing attention per provider of their job, most first: the page's breakdown."""
    totals: Counter[str] = Counter()
    for group in groups:
        totals.update(group.by_provider)
    return sorted(totals.items(), key=lambda pair: (-pair[1], pair[0]))


def find_group(groups: list[Group], key: str | None) -> Group | None:
    return next((g for g in groups if g.key == key), None) if key else None


# --- the page ------------------------------------------------------------------------------


@require_GET
@login_required
@role_required(*VIEWERS)
def operations(request: HtmxHttpRequest) -> HttpResponse:
    """`?group=` opens one group's items (paginated by `page`); `?confirm=` asks before a bulk retry."""
    can_act = has_role(request.user, OPERATOR)
    groups = attention_groups()
    expanded = find_group(groups, request.GET.get("group"))
    confirming = find_group(groups, request.GET.get("confirm")) if can_act else None
    if confirming is not None and confirming.state == S.VALIDATION_FAILED:
        confirming.warning = same_version_warning(list(confirming.items()[:BULK_LIMIT]))
    context = {
        "groups": groups,
        "providers": providers_of(groups),
        "can_act": can_act,
        "expanded": expanded,
        "group_page": (
            screen_page(
                expanded.items(),
                order=["updated_at", "id"],
                per_page=ITEMS_PER_PAGE,
                page=request.GET.get("page"),
                count=expanded.count,
            )
            if expanded
            else None
        ),
        "confirming": confirming,
        "bulk_limit": BULK_LIMIT,
    }
    if wants_partial(request) and expanded:
        return render(request, "operations.html#group-items", {**context, "group": expanded})
    if wants_partial(request) and confirming:
        return render(request, "operations.html#confirm", {**context, "group": confirming})
    unfinished = (
        Submission.objects.filter(state__in=UNFINISHED_SUBMISSIONS)
        .select_related("job")
        # Never observed last on every database (SQLite puts nulls first by default).
        .order_by(F("last_observed_at").asc(nulls_last=True), "id")
    )
    submissions = Paginator(unfinished, SUBMISSIONS_PER_PAGE).get_page(request.GET.get("submissions_page"))
    context["submissions"] = submissions
    context["submission_rows"] = [(s, ago(s.last_observed_at)) for s in submissions]
    for submission in submissions:
        submission.answers_at_once = answers_at_once(submission.provider)
    context["resend_risk"] = RESEND_RISK
    uncertain = []
    if any(g.state == S.SUBMISSION_UNCERTAIN for g in groups):
        uncertain = list(
            Submission.objects.filter(state=SubmissionState.UNCERTAIN)
            .select_related("job")
            .order_by("id")[:20]
        )
        context["uncertain"] = uncertain
    # Why only an operator can settle each of them (rule 13), shown beside "Send again".
    for submission in [*submissions, *uncertain]:
        submission.operator_decides = operator_must_decide(submission)
    return render(request, "operations.html", context)


# --- retrying ------------------------------------------------------------------------------

# Source revisions of a job's items read to estimate what asking for their drafts again costs.
ESTIMATE_SAMPLE = 20


@dataclass(frozen=True)
class RetryCost:
    """What sending items to the model again would cost (the provider's currency; None when a job's
    model has no known price), and what each job's estimate rests on, in words."""

    amount: Decimal | None
    sources: list[str]


def retry_cost(items: list[Item]) -> RetryCost:
    """Estimated as a job's cost is before it starts (ledger.money.estimates)."""
    by_job: dict[int, list[Item]] = defaultdict(list)
    for item in items:
        by_job[item.job_id].append(item)
    total: Decimal | None = Decimal(0)
    sources = []
    for job_items in by_job.values():
        job = job_items[0].job
        sample = SourceRevision.objects.filter(
            pk__in=[item.source_revision_id for item in job_items[:ESTIMATE_SAMPLE]]
        ).values_list("title", "fields")
        per_request = request_estimate(job.prompt_version, sample, provider=job.provider, model=job.model)
        cost = work_cost(price_for(job.provider, job.model), len(job_items), per_request)
        sources.append(
            per_request.source if len(by_job) == 1 else f"job {job.reference}: {per_request.source}"
        )
        total = None if cost is None or total is None else total + cost
    return RetryCost(total, sources)


def same_version_warning(items: list[Item]) -> str:
    """Said before unusable drafts are retried (rule 15): the same prompt version will probably fail
    the same way, and each request is paid again. "" when none of them is unusable."""
    unusable = [item for item in items if item.state == S.VALIDATION_FAILED]
    if not unusable:
        return ""
    versions = sorted({str(item.job.prompt_version) for item in unusable})
    cost = retry_cost(unusable)
    n = len(unusable)
    price = (
        f"about {shown_money_text(cost.amount)}, {'; '.join(cost.sources)}"
        if cost.amount is not None
        else "an unknown amount (no price for the model)"
    )
    return (
        f"{n} draft{'s' if n != 1 else ''} failed the checks of prompt version {', '.join(versions)}. Retrying asks the same "
        f"prompt version again, which will probably fail the same way, and pays for {n} request"
        f"{'s' if n != 1 else ''} again: {price}. To ask with another prompt version, regenerate the "
        "item from its page."
    )


RETRYABLE = frozenset(
    {S.INFERENCE_FAILED, S.VALIDATION_FAILED, S.REJECTED, S.DESTINATION_REJECTED, S.DEAD_LETTER}
)


@dataclass(frozen=True)
class Outcome:
    """What one retry did to one item (as it was before, with its product and job)."""

    item: Item
    retried: bool
    message: str


def retry_one(item: Item, *, actor) -> Outcome:
    """The smallest failed unit of one item, through the ledger's verbs; a refusal is an outcome."""
    if item.state not in RETRYABLE:
        return Outcome(item, False, f"Nothing to retry: the item is now “{item.label}”")
    try:
        if item.state == S.DEAD_LETTER:
            changed = redrive_dead_letter(item.pk, actor=actor)
        else:
            unit = unit_for(item.state, applying=item.approved_version_id is not None)
            changed = retry_item(item.pk, unit=unit, actor=actor)
    except NotAllowed as exc:
        return Outcome(item, False, str(exc))
    return Outcome(item, True, f"Now: {changed.label}")


def retry_all(items: list[Item], *, actor) -> list[Outcome]:
    return [retry_one(item, actor=actor) for item in items]


def render_outcomes(request: HtmxHttpRequest, outcomes: list[Outcome], *, group: Group | None = None):
    retried = sum(o.retried for o in outcomes)
    # Everything refused is a conflict with the current state; anything done is a success.
    status = 409 if outcomes and not retried else 200
    if wants_partial(request) and len(outcomes) == 1:
        return render(request, "operations_result.html#row", {"outcome": outcomes[0]}, status=status)
    context = {"outcomes": outcomes, "retried": retried, "group": group}
    return render(request, "operations_result.html", context, status=status)


def refused(request: HtmxHttpRequest, message: str, *, status: int) -> HttpResponse:
    return render(
        request, "refused.html", {"message": message, "next_url": reverse("operations")}, status=status
    )


@require_POST
@login_required
@role_required(OPERATOR)
def retry(request: HtmxHttpRequest) -> HttpResponse:
    """Retry the items named by `item` (one or more ids), each with its own verb and outcome."""
    raw = request.POST.getlist("item")
    if not raw:
        return refused(request, "Say which item to retry.", status=400)
    ids = list(dict.fromkeys(parse_id(value) for value in raw))
    if None in ids or len(raw) > BULK_LIMIT:
        return refused(request, f"Items are named by their ids, at most {BULK_LIMIT} at once.", status=400)
    found = Item.objects.select_related("product", "job__prompt_version").in_bulk(ids)
    if len(found) != len(ids):
        return refused(
            request, "No such item: " + ", ".join(str(i) for i in ids if i not in found), status=404
        )
    items = [found[i] for i in ids]
    if request.POST.get("confirmed") != "yes" and (warning := same_version_warning(items)):
        # Unusable drafts are retried only once the operator has read what it will probably bring.
        context = {"items": items, "warning": warning}
        if wants_partial(request) and len(items) == 1:
            return render(request, "operations_retry_confirm.html#row", {**context, "item": items[0]})
        return render(request, "operations_retry_confirm.html", context)
    return render_outcomes(request, retry_all(items, actor=request.user))


@require_POST
@login_required
@role_required(OPERATOR)
def retry_group(request: HtmxHttpRequest) -> HttpResponse:
    """The bulk retry the operator confirmed, for the count they were shown. If the group has
    changed since, they are asked again with the new count instead."""
    group = find_group(attention_groups(), request.POST.get("group"))
    if group is None:
        if not request.POST.get("group"):
            return refused(request, "Say which group to retry.", status=400)
        messages.info(request, "That group has no items left; nothing was retried.")
        return redirect("operations")
    if request.POST.get("count") != str(group.bulk_count):
        messages.warning(request, f"The group changed since you confirmed: it now has {group.count} items.")
        return redirect(f"{reverse('operations')}?confirm={group.key}#group-{group.key}")
    items = list(group.items()[:BULK_LIMIT])
    return render_outcomes(request, retry_all(items, actor=request.user), group=group)


# --- uncertain submissions -----------------------------------------------------------------

RECONCILED = {
    "adopted": "Found at the provider as {ref}; its results will be collected as usual.",
    "released": "The provider never received it; its items are queued to be sent again.",
    "waiting": (
        "Not found at the provider yet. Its items are released only once it has stayed unfound for "
        "the grace period after the answer was lost; try again later."
    ),
    "not claimable": "It is no longer uncertain, or a worker is checking it right now.",
    "waiting for an operator": (
        "{provider} cannot be searched for a batch (it has no listing), so nothing tells whether it "
        "received this one. Sending its items again may pay for them twice; it stays uncertain until "
        "an operator decides to send it again."
    ),
}
# "watching 2 candidate(s)": batches from the provider's listing that may be this one.
WATCHING = re.compile(r"^watching (?P<count>\d+) candidate")


def reconciled_message(outcome: str, submission: Submission) -> str:
    if watching := WATCHING.match(outcome):
        return (
            f"{watching['count']} batch(es) at the provider may be this one; they are watched until "
            "their results show whether one is ours."
        )
    return RECONCILED.get(outcome, outcome).format(ref=submission.provider_ref, provider=submission.provider)


@require_POST
@login_required
@role_required(OPERATOR)
def resolve(request: HtmxHttpRequest, submission_id: int) -> HttpResponse:
    submission = get_object_or_404(Submission, pk=submission_id)
    name = submission.provider_ref or submission.intent_key
    try:
        outcome = reconcile_uncertain(submission.pk)
    except (ProviderError, KeyError) as exc:
        messages.error(request, f"{name}: the provider could not be asked ({exc}). Nothing was changed.")
    else:
        submission.refresh_from_db()
        message = reconciled_message(outcome, submission)
        level = messages.SUCCESS if outcome in ("adopted", "released") else messages.WARNING
        messages.add_message(request, level, f"{name}: {message}")
    return redirect("operations")


# Ticked by the operator to say they have read RESEND_RISK.
ACCEPT_RISK = "accept_risk"


@require_POST
@login_required
@role_required(OPERATOR)
def resend(request: HtmxHttpRequest, submission_id: int) -> HttpResponse:
    """Send an uncertain submission's items again at a provider that cannot be searched for it: only
    once the operator has ticked that they accept the risk of paying twice."""
    submission = get_object_or_404(Submission, pk=submission_id)
    name = submission.provider_ref or submission.intent_key
    if request.POST.get(ACCEPT_RISK) != "yes":
        messages.warning(
            request, f"{name}: nothing was sent. Tick that you accept the risk first: {RESEND_RISK}"
        )
        return redirect("operations")
    count = submission.entries.count()
    try:
        resend_uncertain(submission.pk, actor=request.user)
    except NotAllowed as refusal:
        messages.error(request, f"{name}: {refusal}")
    else:
        messages.success(
            request,
            f"{name}: its {count} item{'s' if count != 1 else ''} will be sent again; if {submission.provider} "
            "had received the first batch, both are paid for.",
        )
    return redirect("operations")
