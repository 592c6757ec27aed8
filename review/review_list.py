"""The review list (SPEC §8, `review/?mode=list`): fifty waiting drafts at a time, filtered by job,
category and validity, and the decisions on many at once: the ticked drafts approved or rejected, or
every draft the filters match once their count is confirmed."""

import hashlib
from dataclasses import dataclass, replace
from typing import NamedTuple

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from ledger.actions import NotAllowed
from ledger.actions.reviewing import approve_version, reject_version
from ledger.models import GeneratedVersion, Item, Job, PromptVersion, ReviewClaim
from ledger.states import ItemState

from . import queue
from .common import HtmxHttpRequest, form_errors, refused_page
from .forms import LIST_PAGE_SIZE, MATCHING_LIMIT, ApproveSelectedForm, DecideMatchingForm, RejectSelectedForm
from .item_lists import Column, FieldFilterForm, sorting, with_field
from .paging import capped_count, screen_page
from .permissions import APPROVERS, has_role, role_required


@dataclass(frozen=True)
class ReviewFilter:
    """Which waiting drafts list mode shows and an "all matching" decision takes: of a job, of a
    category (as the item's source revision states it), valid or invalid."""

    job: int | None = None
    category: str = ""
    validity: str = ""

    @classmethod
    def of(cls, place: dict) -> "ReviewFilter":
        return cls(place.get("job"), place.get("category") or "", place.get("validity") or "")

    def items(self) -> QuerySet[Item]:
        items = queue.with_latest_draft(queue.review_queue_items(self.job))
        if self.category:
            items = items.filter(source_revision__fields__category=self.category)
        if self.validity:
            latest_valid = (
                GeneratedVersion.objects.filter(item=OuterRef("pk")).order_by("-number").values("valid")[:1]
            )
            items = items.annotate(latest_valid=Subquery(latest_valid)).filter(
                latest_valid=self.validity == "valid"
            )
        return items

    def count(self) -> int:
        """From the tallies when only the job narrows the queue; counted otherwise."""
        return self.items().count() if self.category or self.validity else queue.waiting_count(self.job)

    def params(self) -> dict:
        return {"job": self.job or "", "category": self.category, "validity": self.validity}

    def words(self) -> str:
        """The filters in words, for a confirmation."""
        parts = []
        if self.job:
            parts.append(
                f"of job {Job.objects.filter(pk=self.job).values_list('reference', flat=True).first()}"
            )
        if self.category:
            parts.append(f"in category “{self.category}”")
        if self.validity:
            parts.append(self.validity)
        return ", ".join(parts) or "every waiting draft"


def matching_drafts(review_filter: ReviewFilter) -> tuple[list[Item], str]:
    """The oldest MATCHING_LIMIT drafts the filter matches, and their fingerprint: a hash of each
    item and the draft it would be decided on, so a set changed since it was confirmed is noticed."""
    items = list(review_filter.items().select_related("product")[:MATCHING_LIMIT])
    named = ",".join(f"{item.pk}:{item.latest_version_id}" for item in items)
    return items, hashlib.sha256(named.encode()).hexdigest()


def reason_choices(cards: list[queue.ReviewCard]) -> list[dict]:
    """The rejection reasons of the prompt versions of the drafts listed, each code once, in order."""
    seen: dict[str, dict] = {}
    prompts = {card.item.job.prompt_version_id for card in cards}
    for reasons in (
        PromptVersion.objects.filter(pk__in=prompts)
        .order_by("pk")
        .values_list("rejection_reasons", flat=True)
    ):
        for reason in reasons:
            seen.setdefault(reason["code"], reason)
    return list(seen.values())


# The list's columns it sorts by; otherwise oldest first. Not the title: no index keeps the waiting
# drafts in title order, and sorting 25,000 of them took 0.2 s.
REVIEW_LIST_COLUMNS = [Column("sku", "SKU", "product__sku"), Column("job", "Job", "job__reference")]


def review_list(request: HtmxHttpRequest, review_filter: ReviewFilter) -> HttpResponse:
    count = review_filter.count()
    # What the list shows of each row: not the source's fields nor the published text.
    items = review_filter.items().defer("source_revision__fields", "product__published_content")
    by_field = FieldFilterForm(request.GET)
    if by_field.active:
        items = with_field(items, by_field)
        count = capped_count(items)
    sort = sorting(request.GET, REVIEW_LIST_COLUMNS, default=queue.QUEUE_ORDER)
    if sort.refused:
        messages.warning(request, sort.refused)
    page = screen_page(
        sort.apply(items),
        order=sort.order,
        per_page=LIST_PAGE_SIZE,
        page=request.GET.get("page"),
        count=count,
    )
    can_decide = has_role(request.user, *APPROVERS)
    cards = queue.review_cards(page.object_list)
    holders = dict(
        ReviewClaim.objects.held()
        .filter(item_id__in=[card.item.pk for card in cards])
        .exclude(reviewer=request.user)
        .values_list("item_id", "reviewer__username")
    )
    context = {
        "page": page,
        "cards": [replace(card, held_by=holders.get(card.item.pk, "")) for card in cards],
        "reason_choices": reason_choices(cards),
        "job_id": review_filter.job,
        "filter": review_filter,
        "jobs": queue.jobs_in_review(review_filter.job),
        "can_decide": can_decide,
        "return_to": request.get_full_path(),
        "matching_limit": MATCHING_LIMIT,
        "by_field": by_field,
        "headings": sort.headings,
    }
    # "All matching" decides by the job, category and check filters only: not offered under a field's.
    if can_decide and request.GET.get("confirm") == "all" and count and not by_field.active:
        items, fingerprint = matching_drafts(review_filter)
        context["matching"] = {"count": len(items), "of": count, "fingerprint": fingerprint}
    return render(request, "review_list.html", context, status=400 if by_field.errors else 200)


class Ticked(NamedTuple):
    """A draft to decide on in a bulk decision, with the content hash the reviewer saw of it."""

    item: Item
    version: GeneratedVersion
    digest: str


def out_of_date(pairs: list[tuple[int, str]]) -> tuple[dict[int, GeneratedVersion], list[str]]:
    """The ticked drafts (by version id), and what no longer matches the page they were ticked on: a
    draft unknown or changed, an item decided since, or one with a newer draft than the row showed."""
    latest = GeneratedVersion.objects.filter(item=OuterRef("item_id")).order_by("-number").values("pk")[:1]
    versions = (
        GeneratedVersion.objects.filter(pk__in=[version_id for version_id, _ in pairs])
        .select_related("item__product")
        .annotate(latest_id=Subquery(latest))
        .in_bulk()
    )
    stale = []
    for version_id, digest in pairs:
        version = versions.get(version_id)
        if version is None:
            stale.append(f"draft {version_id} does not exist")
            continue
        sku = version.item.product.sku
        if version.content_hash != digest:
            stale.append(f"{sku}: the draft changed since the page was shown")
        elif version.item.state != ItemState.AWAITING_REVIEW:
            stale.append(f"{sku} is no longer waiting for review ({version.item.label.lower()})")
        elif version.latest_id != version.pk:
            stale.append(f"{sku} has a newer draft than the one shown")
    return versions, stale


def fresh_ticks(
    request: HtmxHttpRequest, pairs: list[tuple[int, str]], *, approve: bool
) -> list[Ticked] | None:
    """The ticked drafts, or None, said in a message, when any of them is no longer what the page
    showed (decided since, changed, or superseded: the ticks of a page the browser brought back)."""
    versions, stale = out_of_date(pairs)
    if stale:
        infinitive, past = ("approve", "approved") if approve else ("reject", "rejected")
        messages.error(
            request,
            f"Nothing was {past}: the page you ticked on is out of date ("
            + "; ".join(stale)
            + f"). This is the list as it is now: tick the drafts to {infinitive} again.",
        )
        return None
    return [Ticked(versions[version_id].item, versions[version_id], digest) for version_id, digest in pairs]


def decide_each(
    request: HtmxHttpRequest, drafts: list[Ticked], *, approve: bool, reason: str = "", reason_code: str = ""
) -> None:
    """Approve each draft (by the hash the page showed), or reject each for `reason`: each its own
    decision, the ledger refusing the ones it may not take. Says how many were decided and why each
    other one was not."""
    done, refusals = 0, []
    for item, version, digest in drafts:
        try:
            if approve:
                approve_version(
                    item_id=item.pk, version_id=version.pk, version_hash=digest, approver=request.user
                )
            else:
                reject_version(
                    item_id=item.pk,
                    version_id=version.pk,
                    reviewer=request.user,
                    reason=reason,
                    reason_code=reason_code,
                )
        except NotAllowed as exc:
            refusals.append(f"{item.product.sku}: {exc}")
        else:
            done += 1
    verb = "Approved" if approve else "Rejected"
    if done:
        being = "; being applied" if approve else ""
        messages.success(request, f"{verb} {done} draft{'s' if done != 1 else ''}{being}.")
    for refusal in refusals:
        messages.error(request, f"Not {verb.lower()} — {refusal}")


@require_POST
@login_required
@role_required(*APPROVERS)
def approve_selected(request: HtmxHttpRequest) -> HttpResponse:
    """Approve the ticked drafts of the list, each named by the version id and content hash its row
    showed (rule 15). If any of them is no longer what the page showed, nothing is approved and the
    reviewer ticks again on the list as it is now. Otherwise each is its own decision: the ledger
    approves the valid, current ones and refuses the others, saying why."""
    back = queue.next_url(request, default=queue.queue_url(mode="list"))
    form = ApproveSelectedForm(request.POST)
    if not form.is_valid():
        return refused_page(request, form_errors(form), back)
    if request.POST.get("reason", "").strip() or request.POST.get("reason_code"):
        # A reason is typed to reject: Enter in its field submits the form with its first button.
        messages.error(
            request,
            "Nothing was approved: a reason for rejecting was typed. Press “Reject selected drafts” to "
            "reject the ticked drafts, or clear the reason to approve them.",
        )
        return redirect(back)
    drafts = fresh_ticks(request, form.cleaned_data["draft"], approve=True)
    if drafts is not None:
        decide_each(request, drafts, approve=True)
    return redirect(back)


def list_url(review_filter: ReviewFilter, **more) -> str:
    return queue.queue_url(mode="list", **review_filter.params(), **more)


@require_POST
@login_required
@role_required(*APPROVERS)
def reject_selected(request: HtmxHttpRequest) -> HttpResponse:
    """Reject the ticked drafts of the list for one reason, each the draft its row showed; if any of
    them is no longer what the page showed, nothing is rejected (as for approving)."""
    back = queue.next_url(request, default=queue.queue_url(mode="list"))
    form = RejectSelectedForm(request.POST)
    if not form.is_valid():
        return refused_page(request, form_errors(form), back)
    drafts = fresh_ticks(request, form.cleaned_data["draft"], approve=False)
    if drafts is not None:
        decide_each(
            request,
            drafts,
            approve=False,
            reason=form.cleaned_data["reason"],
            reason_code=form.cleaned_data["reason_code"],
        )
    return redirect(back)


@require_POST
@login_required
@role_required(*APPROVERS)
def decide_matching(request: HtmxHttpRequest) -> HttpResponse:
    """Approve or reject every draft the list's filters match (the oldest MATCHING_LIMIT), as the
    reviewer confirmed them: if the drafts matching are no longer those counted on the confirmation,
    nothing is decided and the reviewer is asked again with the set as it is now."""
    review_filter = ReviewFilter.of(queue.place_of(request.POST))
    form = DecideMatchingForm(request.POST)
    if not form.is_valid():
        return refused_page(request, form_errors(form), list_url(review_filter))
    items, fingerprint = matching_drafts(review_filter)
    if len(items) != form.cleaned_data["count"] or fingerprint != form.cleaned_data["fingerprint"]:
        messages.warning(
            request,
            f"The drafts matching changed since you confirmed: {len(items)} now. Nothing was decided; "
            "confirm again.",
        )
        return redirect(list_url(review_filter, confirm="all"))
    versions = GeneratedVersion.objects.in_bulk([item.latest_version_id for item in items])
    drafts = [
        Ticked(item, versions[item.latest_version_id], versions[item.latest_version_id].content_hash)
        for item in items
    ]
    decide_each(
        request,
        drafts,
        approve=form.cleaned_data["decision"] == "approve",
        reason=form.cleaned_data["reason"],
        reason_code=form.cleaned_data["reason_code"],
    )
    return redirect(list_url(review_filter))
