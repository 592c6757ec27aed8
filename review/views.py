"""Drafts: an item's page and the review desk (SPEC §8). Small function views: one URL, one context, and
two renderings, the whole page or, for an htmx request, one template partial of it.

The desk has two modes. Focus mode shows one draft at a time beside its source revision, compared word by
word with the text published now; a decision sent with htmx answers with what happened to that draft and
the next one to decide on. List mode is a table of fifty drafts at a time, for approving many at once."""

import hashlib
from dataclasses import dataclass, replace
from decimal import Decimal
from functools import cached_property
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import OuterRef, QuerySet, Subquery, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.text import Truncator
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from ledger.actions import NotAllowed, currency_problem
from ledger.actions.reviewing import (
    REGENERABLE_STATES,
    EditRefused,
    approve_version,
    regenerate_with_prompt,
    reject_version,
)
from ledger.estimates import request_estimate, work_cost
from ledger.models import GeneratedVersion, Item, ItemTally, Job, PromptVersion
from ledger.pricing import is_apportioned, price_for, unknown_price, version_cost
from ledger.states import DECIDABLE_STATES, STOPS, ItemState, JobState

from .common import HtmxHttpRequest, ShownValue, fields_of, wants_partial, word_diff
from .forms import (
    LIST_PAGE_SIZE,
    MATCHING_LIMIT,
    ApproveForm,
    ApproveSelectedForm,
    DecideMatchingForm,
    RegenerateForm,
    RejectForm,
    RejectSelectedForm,
    ReviewPlaceForm,
)
from .paging import PageRefused, _beyond, _read_token, _reversed, _token, screen_page
from .permissions import APPROVERS, OPERATOR, VIEWERS, has_role, role_required

INVALID_NOTE = "Only a valid draft can be approved"
# How much of each draft the list shows.
PREVIEW_CHARS = 140


def published_text(item: Item) -> str:
    product = item.product
    return product.published_content if product.published_version_id else ""


# --- the item page -------------------------------------------------------------------------


@dataclass(frozen=True)
class VersionView:
    """One generated version on the item page, with what it cost and how it differs from the published text."""

    version: GeneratedVersion
    cost: Decimal | None  # None: the job's model has no known price
    diff: list[tuple[str, str]]

    @property
    def apportioned(self) -> bool:
        return is_apportioned(self.version)

    @property
    def price_note(self) -> str:
        job = self.version.item.job
        return unknown_price(job.provider, job.model)


@require_GET
@login_required
@role_required(*VIEWERS)
def item_detail(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    item = get_object_or_404(
        Item.objects.select_related(
            "job__prompt_version",
            "product__current_revision",
            "product__published_version",
            "source_revision",
        ),
        pk=item_id,
    )
    versions = list(item.versions.order_by("number"))
    published = published_text(item)
    for version in versions:
        version.item = item  # the job, for its price, without a query per version
    latest = versions[-1] if versions else None
    product = item.product
    current = product.current_revision if product.current_revision_id != item.source_revision_id else None
    # Waiting for review: approve (the text as it stands in the box, judged like a draft) or reject.
    # Unusable (validation_failed): an owner may edit the draft into a valid text and approve it.
    can_decide = item.state in DECIDABLE_STATES and latest is not None and has_role(request.user, *APPROVERS)
    currency = currency_problem(item) if can_decide else None
    context = {
        "item": item,
        "product": product,
        "source_fields": fields_of(item.source_revision),
        "current_revision": current,
        "current_fields": fields_of(current) if current else [],
        "revision_note": STOPS[ItemState.OBSOLETE].event,
        "versions": [
            VersionView(v, version_cost(v), [] if v.content_expired_at else word_diff(published, v.content))
            for v in versions
        ],
        "latest": latest,
        "approvals": item.approvals.select_related("approved_by", "version").order_by("approved_at", "id"),
        "attempts": item.destination_attempts.select_related("version").order_by("started_at", "id"),
        "events": item.events.order_by("id"),
        "can_decide": can_decide,
        "can_reject": can_decide and item.state == ItemState.AWAITING_REVIEW,
        "regenerate_choices": regenerate_choices(item) if may_regenerate(request.user, item) else [],
        "approve_refusal": STOPS[currency].note if currency else "",
    }
    return render(request, "item_detail.html", context)


def may_regenerate(user, item: Item) -> bool:
    return (
        item.state in REGENERABLE_STATES and item.job.state != JobState.CANCELLED and has_role(user, OPERATOR)
    )


@dataclass(frozen=True)
class PromptChoice:
    """A prompt version an unusable or rejected draft may be asked again with, and what one request
    with it is expected to cost (the provider's currency; None without a known price)."""

    prompt: PromptVersion
    cost: Decimal | None
    used: bool  # the version the draft was written with


def regenerate_choices(item: Item) -> list[PromptChoice]:
    job = item.job
    price = price_for(job.provider, job.model)
    sample = [(item.product.current_revision.title, item.product.current_revision.fields)]
    return [
        PromptChoice(
            prompt, work_cost(price, 1, request_estimate(prompt, sample)), prompt.pk == job.prompt_version_id
        )
        for prompt in PromptVersion.objects.filter(task=job.task).order_by("-version")
    ]


def refusal_of(version: GeneratedVersion | None, currency: str | None) -> str:
    """Why approving this draft would be refused, said before anyone tries; "" when it may be approved.
    The ledger decides again at approval."""
    if currency:
        return STOPS[currency].note
    if version is None:
        return "No draft recorded"
    if not version.valid:
        return INVALID_NOTE
    return ""


# --- the review desk -----------------------------------------------------------------------


@dataclass(frozen=True)
class ReviewCard:
    """An item waiting for a decision, the draft to decide on (its latest version), and whether the
    product is still what the draft was written for (`currency`: None, "obsolete" or "withdrawn")."""

    item: Item
    version: GeneratedVersion | None
    currency: str | None = None

    @property
    def source_fields(self) -> list[tuple[str, ShownValue]]:
        return fields_of(self.item.source_revision)

    @property
    def published(self) -> str:
        return published_text(self.item)

    @cached_property
    def diff(self) -> list[tuple[str, str]]:
        return word_diff(self.published, self.version.content) if self.version else []

    @cached_property
    def cost(self) -> Decimal | None:
        """None without a draft, or when the job's model has no known price (`price_note` says so)."""
        return version_cost(self.version) if self.version else None

    @property
    def price_note(self) -> str:
        return unknown_price(self.item.job.provider, self.item.job.model)

    @property
    def apportioned(self) -> bool:
        return bool(self.version) and is_apportioned(self.version)

    @cached_property
    def refusal(self) -> str:
        return refusal_of(self.version, self.currency)

    @cached_property
    def preview(self) -> str:
        """The start of the draft, as `truncatechars:PREVIEW_CHARS` shows it (plain ASCII text is cut
        directly: the filter looks at every character for combining marks, which ASCII has none of)."""
        text = (self.version.content if self.version else "") or "No draft recorded."
        if text.isascii():
            return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"
        return Truncator(text).chars(PREVIEW_CHARS)


def with_latest_draft(items: QuerySet[Item]) -> QuerySet[Item]:
    """Items as a card shows them: with job, product and revision, and their latest version's id."""
    latest = GeneratedVersion.objects.filter(item=OuterRef("pk")).order_by("-number").values("pk")[:1]
    return items.select_related("job", "product", "source_revision").annotate(
        latest_version_id=Subquery(latest)
    )


def review_cards(items: QuerySet[Item] | list[Item]) -> list[ReviewCard]:
    """Cards for many items in two queries (items already read `with_latest_draft`: one);
    `currency` read from the products loaded with them."""
    if isinstance(items, QuerySet):
        items = list(with_latest_draft(items))
    versions = GeneratedVersion.objects.in_bulk(i.latest_version_id for i in items if i.latest_version_id)
    cards = []
    for item in items:
        version = versions.get(item.latest_version_id)
        if version is not None:
            version.item = item  # the job, for its price, without a query per row
        cards.append(ReviewCard(item, version, currency_problem(item, product=item.product)))
    return cards


def review_queue_items(job_id: int | None) -> QuerySet[Item]:
    """Drafts waiting for a decision, oldest first: a decision takes one out and the rest keep their place."""
    queue = Item.objects.awaiting_review().order_by("updated_at", "id")
    return queue.filter(job_id=job_id) if job_id else queue


def waiting_count(job_id: int | None) -> int:
    """Drafts waiting, from the item tallies (of the job, or of every job)."""
    tallies = ItemTally.objects.filter(job_id=job_id) if job_id else ItemTally.objects.all()
    return tallies.counts_by_state().get(ItemState.AWAITING_REVIEW, 0)


def queue_url(**params) -> str:
    query = urlencode({name: value for name, value in params.items() if value})
    return reverse("review_queue") + (f"?{query}" if query else "")


def jobs_in_review(selected: int | None) -> list[tuple[int, str, int]]:
    """(id, reference, drafts waiting) for the job filter, newest job first; the selected job always."""
    rows = [
        row
        for row in ItemTally.objects.filter(state=ItemState.AWAITING_REVIEW)
        .order_by("-job_id")
        .values_list("job_id", "job__reference")
        .annotate(n=Sum("items"))
        if row[2]
    ]
    if selected and selected not in {job_id for job_id, _, _ in rows}:
        rows += [
            (pk, reference, 0)
            for pk, reference in Job.objects.filter(pk=selected).values_list("pk", "reference")
        ]
    return rows


def place_of(data) -> dict:
    """The valid parts of a ReviewPlaceForm; a bad value is as if it were absent."""
    form = ReviewPlaceForm(data)
    form.is_valid()
    return form.cleaned_data


QUEUE_ORDER = ["updated_at", "id"]


def cursor_key(token: str | None) -> list | None:
    """The queue key a cursor names, or None for no cursor or a bad one (then the position is used)."""
    if not token:
        return None
    try:
        direction, key = _read_token(Item, QUEUE_ORDER, token)
    except PageRefused:
        return None
    return key if direction == "after" else None


def focus_context(
    request: HttpRequest,
    *,
    job_id: int | None,
    pos: int | None,
    after: str | None = None,
    decided: Item | None = None,
    outcome: str = "",
    error: str = "",
    refused_item: int | None = None,
    edited_text: str | None = None,
) -> dict:
    """The draft at position `pos` of the queue (clamped to it), and what happened to the one decided on.

    With `after`, the cursor of the draft before it, the draft is the first one after that, read from
    the queue's index wherever it is; `pos` is then only shown, and may be None (not known: a draft
    opened by its item deep in the queue). Without it (the first draft, or a position typed in), the
    queue is counted into from its nearer end. The links to the next and previous drafts, and the
    place a decision comes back to, carry the cursor of the draft before theirs."""
    queue = review_queue_items(job_id)
    count = waiting_count(job_id)
    key = cursor_key(after) if pos is None or pos > 1 else None
    if pos is not None or key is None:
        pos = min(max(pos or 1, 1), count)
    at: tuple | None = None
    if key is not None:
        at = (
            queue.filter(_beyond(Item, QUEUE_ORDER, key, backwards=False))
            .values_list("pk", "updated_at")
            .first()
        )
    if at is None and count:
        pos = pos or 1
        if pos - 1 <= count - pos:
            at = queue.values_list("pk", "updated_at")[pos - 1 : pos].first()
        else:
            backwards = queue.order_by(*_reversed(QUEUE_ORDER))
            at = backwards.values_list("pk", "updated_at")[count - pos : count - pos + 1].first()
    # The drafts before it, nearest first: the cursors of this place and of the previous one.
    before = []
    if at is not None and pos != 1:
        current = [at[1], at[0]]
        before = [
            [moment, pk]
            for pk, moment in queue.filter(_beyond(Item, QUEUE_ORDER, current, backwards=True))
            .order_by(*_reversed(QUEUE_ORDER))
            .values_list("pk", "updated_at")[:2]
        ]
        if pos is None and len(before) < 2:
            pos = len(before) + 1  # near the start: known after all
    cursors = [_token("after", [moment.isoformat(), pk]) for moment, pk in before]
    here = cursors[0] if cursors else None
    cards = review_cards(Item.objects.filter(pk=at[0])) if at is not None else []
    card = cards[0] if cards else None
    if card is not None:  # one draft: ask the ledger's own rule, as approving it will
        card = replace(card, currency=currency_problem(card.item))
    following = _token("after", [at[1].isoformat(), at[0]]) if at is not None else None
    if pos is None:
        previous_url = queue_url(job=job_id, after=cursors[1]) if len(cursors) > 1 else queue_url(job=job_id)
        next_url = queue_url(job=job_id, after=following) if following else ""
    else:
        previous_url = (
            queue_url(job=job_id, pos=pos - 1, after=cursors[1] if len(cursors) > 1 else None)
            if pos > 1
            else ""
        )
        next_url = queue_url(job=job_id, pos=pos + 1, after=following) if pos < count else ""
    return {
        "card": card,
        "pos": pos,
        "count": count,
        "job_id": job_id,
        "after": here,
        "previous_url": previous_url,
        "next_url": next_url,
        "return_to": queue_url(job=job_id, pos=pos, after=here),
        "decided": decided,
        "outcome": outcome,
        "error": error if decided else "",
        # A refusal stays with its own draft's card, never on the next one shown (rule 15), with the
        # text the reviewer had typed when it was an edit.
        "card_error": error if refused_item and card and card.item.pk == refused_item else "",
        "edited_text": edited_text if refused_item and card and card.item.pk == refused_item else None,
        "can_decide": has_role(request.user, *APPROVERS),
    }


# Where a draft opened by its item stands is counted up to this many drafts from either end of the
# queue; deeper, it is not shown (counting costs what the count is).
POSITION_COUNT_CAP = 5_000


def place_in(job_id: int | None, item: Item) -> tuple[int | None, str | None] | None:
    """Where a waiting item stands in the queue (of the job, or of every job): (its position, or None
    when deeper than POSITION_COUNT_CAP from both ends; the cursor of the draft before it), or None
    when it is not in the queue."""
    queue = review_queue_items(job_id)
    if not queue.filter(pk=item.pk).exists():
        return None
    key = [item.updated_at, item.pk]
    earlier = queue.filter(_beyond(Item, QUEUE_ORDER, key, backwards=True))
    previous = earlier.order_by(*_reversed(QUEUE_ORDER)).values_list("updated_at", "pk").first()
    after = _token("after", [previous[0].isoformat(), previous[1]]) if previous else None
    ahead = earlier.order_by()[:POSITION_COUNT_CAP].count()
    if ahead < POSITION_COUNT_CAP:
        return ahead + 1, after
    behind = (
        queue.filter(_beyond(Item, QUEUE_ORDER, key, backwards=False)).order_by()[:POSITION_COUNT_CAP].count()
    )
    if behind < POSITION_COUNT_CAP:
        return max(waiting_count(job_id) - behind, 1), after
    return None, after


@require_GET
@vary_on_headers("HX-Request")
@login_required
@role_required(*VIEWERS)
def review_queue(request: HtmxHttpRequest) -> HttpResponse:
    place = place_of(request.GET)
    job_id = place.get("job")
    if place.get("mode") == "list":
        return review_list(request, ReviewFilter.of(place))
    pos, after = place.get("pos"), place.get("after")
    if item_id := place.get("item"):
        item = get_object_or_404(Item, pk=item_id)
        found = place_in(job_id, item)
        if found is None:  # decided already: its own page says what became of it
            return redirect("item_detail", item.pk)
        pos, after = found
    context = focus_context(request, job_id=job_id, pos=pos, after=after)
    if wants_partial(request) and not request.htmx.history_restore_request:
        return render(request, "review_queue.html#focus", context)
    context["jobs"] = jobs_in_review(job_id)
    return render(request, "review_queue.html", context)


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
        items = with_latest_draft(review_queue_items(self.job))
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
        return self.items().count() if self.category or self.validity else waiting_count(self.job)

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


def review_list(request: HtmxHttpRequest, review_filter: ReviewFilter) -> HttpResponse:
    count = review_filter.count()
    page = screen_page(
        # What the list shows of each row: not the source's fields nor the published text.
        review_filter.items().defer("source_revision__fields", "product__published_content"),
        order=["updated_at", "id"],
        per_page=LIST_PAGE_SIZE,
        page=request.GET.get("page"),
        count=count,
    )
    can_decide = has_role(request.user, *APPROVERS)
    context = {
        "page": page,
        "cards": review_cards(page.object_list),
        "job_id": review_filter.job,
        "filter": review_filter,
        "jobs": jobs_in_review(review_filter.job),
        "can_decide": can_decide,
        "return_to": request.get_full_path(),
        "matching_limit": MATCHING_LIMIT,
    }
    if can_decide and request.GET.get("confirm") == "all" and count:
        items, fingerprint = matching_drafts(review_filter)
        context["matching"] = {"count": len(items), "of": count, "fingerprint": fingerprint}
    return render(request, "review_list.html", context)


# --- deciding ------------------------------------------------------------------------------


def next_url(request: HttpRequest, default: str = "") -> str:
    """Where a plain form post returns to: the page it came from, if it is ours."""
    url = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(
        url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return url
    return default or reverse("review_queue")


def form_errors(form: forms.Form) -> str:
    return " ".join(str(error) for errors in form.errors.values() for error in errors)


def render_focus(
    request: HtmxHttpRequest,
    item_id: int,
    *,
    outcome: str = "",
    error: str = "",
    edited_text: str | None = None,
    status: int = 200,
) -> HttpResponse:
    """The answer to a decision sent from focus mode. Still waiting (a refusal): the same draft, saying
    why nothing changed. Decided, or gone from the queue: what became of it, then the draft now at the
    reviewer's position, which is the next one."""
    place = place_of(request.POST)
    job_id = place.get("job")
    item = Item.objects.select_related("product").get(pk=item_id)
    still_waiting = None if outcome else place_in(job_id, item)
    if still_waiting:
        pos, after = still_waiting
        context = focus_context(
            request,
            job_id=job_id,
            pos=pos,
            after=after,
            error=error,
            refused_item=item.pk,
            edited_text=edited_text,
        )
    else:
        context = focus_context(
            request,
            job_id=job_id,
            pos=place.get("pos"),
            after=place.get("after"),
            decided=item,
            outcome=outcome,
            error=error,
        )
    response = render(request, "review_queue.html#focus", context, status=status)
    response["HX-Replace-Url"] = context["return_to"]  # a reload shows the draft now on screen
    return response


def refused(
    request: HtmxHttpRequest, item: Item, message: str, *, status: int, edited_text: str | None = None
) -> HttpResponse:
    """Nothing was changed: say why, in the desk (htmx), on an error page (bad input) or as a message."""
    if wants_partial(request):
        return render_focus(request, item.pk, error=message, edited_text=edited_text, status=status)
    if status == 400:
        return render(
            request, "refused.html", {"message": message, "next_url": next_url(request)}, status=400
        )
    messages.error(request, f"{item.product.sku}: {message}")
    return redirect(next_url(request))


def decided(request: HtmxHttpRequest, item: Item, outcome: str) -> HttpResponse:
    if wants_partial(request):
        return render_focus(request, item.pk, outcome=outcome)
    messages.success(request, f"{item.product.sku}: {outcome}.")
    return redirect(next_url(request))


@require_POST
@login_required
@role_required(*APPROVERS)
def approve(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    item = get_object_or_404(Item.objects.select_related("product"), pk=item_id)
    form = ApproveForm(request.POST)
    if not form.is_valid():
        return refused(request, item, form_errors(form), status=400)
    try:
        approval = approve_version(
            item_id=item.pk,
            version_id=form.cleaned_data["version_id"],
            version_hash=form.cleaned_data["version_hash"],
            approver=request.user,
            content=form.cleaned_data["content"],
            note=form.cleaned_data["note"],
        )
    except EditRefused as exc:
        return refused(request, item, str(exc), status=400, edited_text=form.cleaned_data["content"])
    except NotAllowed as exc:
        return refused(request, item, str(exc), status=409)
    outcome = "Approved with your edits — being applied" if approval.edited else "Approved — being applied"
    return decided(request, item, outcome)


@require_POST
@login_required
@role_required(*APPROVERS)
def reject(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    item = get_object_or_404(Item.objects.select_related("product"), pk=item_id)
    form = RejectForm(request.POST)
    if not form.is_valid():
        return refused(request, item, form_errors(form), status=400)
    try:
        reject_version(
            item_id=item.pk,
            version_id=form.cleaned_data["version_id"],
            reviewer=request.user,
            reason=form.cleaned_data["reason"],
        )
    except NotAllowed as exc:
        return refused(request, item, str(exc), status=409)
    return decided(request, item, "Rejected")


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


@require_POST
@login_required
@role_required(*APPROVERS)
def approve_selected(request: HtmxHttpRequest) -> HttpResponse:
    """Approve the ticked drafts of the list, each named by the version id and content hash its row
    showed (rule 15). If any of them is no longer what the page showed (decided since, changed, or
    superseded: the ticks of a page the browser brought back), nothing is approved and the reviewer
    ticks again on the list as it is now. Otherwise each is its own decision: the ledger approves the
    valid, current ones and refuses the others, saying why."""
    back = next_url(request, default=queue_url(mode="list"))
    form = ApproveSelectedForm(request.POST)
    if not form.is_valid():
        return render(request, "refused.html", {"message": form_errors(form), "next_url": back}, status=400)
    if request.POST.get("reason", "").strip():
        # A reason is typed to reject: Enter in its field submits the form with its first button.
        messages.error(
            request,
            "Nothing was approved: a reason for rejecting was typed. Press “Reject selected drafts” to "
            "reject the ticked drafts, or clear the reason to approve them.",
        )
        return redirect(back)
    pairs: list[tuple[int, str]] = form.cleaned_data["draft"]
    versions, stale = out_of_date(pairs)
    if stale:
        messages.error(
            request,
            "Nothing was approved: the page you ticked on is out of date ("
            + "; ".join(stale)
            + "). This is the list as it is now: tick the drafts to approve again.",
        )
        return redirect(back)
    approved, refusals = 0, []
    for version_id, digest in pairs:
        version = versions[version_id]
        try:
            approve_version(
                item_id=version.item_id, version_id=version.pk, version_hash=digest, approver=request.user
            )
        except NotAllowed as exc:
            refusals.append(f"{version.item.product.sku}: {exc}")
        else:
            approved += 1
    if approved:
        messages.success(request, f"Approved {approved} draft{'s' if approved != 1 else ''}; being applied.")
    for refusal in refusals:
        messages.error(request, f"Not approved — {refusal}")
    return redirect(back)


def list_url(review_filter: ReviewFilter, **more) -> str:
    return queue_url(mode="list", **review_filter.params(), **more)


@require_POST
@login_required
@role_required(*APPROVERS)
def reject_selected(request: HtmxHttpRequest) -> HttpResponse:
    """Reject the ticked drafts of the list for one reason, each the draft its row showed; if any of
    them is no longer what the page showed, nothing is rejected (as for approving)."""
    back = next_url(request, default=queue_url(mode="list"))
    form = RejectSelectedForm(request.POST)
    if not form.is_valid():
        return render(request, "refused.html", {"message": form_errors(form), "next_url": back}, status=400)
    pairs: list[tuple[int, str]] = form.cleaned_data["draft"]
    versions, stale = out_of_date(pairs)
    if stale:
        messages.error(
            request,
            "Nothing was rejected: the page you ticked on is out of date ("
            + "; ".join(stale)
            + "). This is the list as it is now: tick the drafts to reject again.",
        )
        return redirect(back)
    rejected, refusals = 0, []
    for version_id, _ in pairs:
        version = versions[version_id]
        try:
            reject_version(
                item_id=version.item_id,
                version_id=version.pk,
                reviewer=request.user,
                reason=form.cleaned_data["reason"],
            )
        except NotAllowed as exc:
            refusals.append(f"{version.item.product.sku}: {exc}")
        else:
            rejected += 1
    if rejected:
        messages.success(request, f"Rejected {rejected} draft{'s' if rejected != 1 else ''}.")
    for refusal in refusals:
        messages.error(request, f"Not rejected — {refusal}")
    return redirect(back)


@require_POST
@login_required
@role_required(*APPROVERS)
def decide_matching(request: HtmxHttpRequest) -> HttpResponse:
    """Approve or reject every draft the list's filters match (the oldest MATCHING_LIMIT), as the
    reviewer confirmed them: if the drafts matching are no longer those counted on the confirmation,
    nothing is decided and the reviewer is asked again with the set as it is now."""
    review_filter = ReviewFilter.of(place_of(request.POST))
    form = DecideMatchingForm(request.POST)
    if not form.is_valid():
        return render(
            request,
            "refused.html",
            {"message": form_errors(form), "next_url": list_url(review_filter)},
            status=400,
        )
    items, fingerprint = matching_drafts(review_filter)
    if len(items) != form.cleaned_data["count"] or fingerprint != form.cleaned_data["fingerprint"]:
        messages.warning(
            request,
            f"The drafts matching changed since you confirmed: {len(items)} now. Nothing was decided; "
            "confirm again.",
        )
        return redirect(list_url(review_filter, confirm="all"))
    approving = form.cleaned_data["decision"] == "approve"
    versions = GeneratedVersion.objects.in_bulk([item.latest_version_id for item in items])
    done, refusals = 0, []
    for item in items:
        version = versions[item.latest_version_id]
        try:
            if approving:
                approve_version(
                    item_id=item.pk,
                    version_id=version.pk,
                    version_hash=version.content_hash,
                    approver=request.user,
                )
            else:
                reject_version(
                    item_id=item.pk,
                    version_id=version.pk,
                    reviewer=request.user,
                    reason=form.cleaned_data["reason"],
                )
        except NotAllowed as exc:
            refusals.append(f"{item.product.sku}: {exc}")
        else:
            done += 1
    verb = "Approved" if approving else "Rejected"
    if done:
        being = "; being applied" if approving else ""
        messages.success(request, f"{verb} {done} draft{'s' if done != 1 else ''}{being}.")
    for refusal in refusals:
        messages.error(request, f"Not {verb.lower()} — {refusal}")
    return redirect(list_url(review_filter))


@require_POST
@login_required
@role_required(OPERATOR)
def regenerate(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    """Ask for a new draft of an unusable or rejected item with the prompt version the operator chose:
    a one-item job (a job has one prompt version). The same form sent again shows the job it started."""
    item = get_object_or_404(Item.objects.select_related("product", "job"), pk=item_id)
    form = RegenerateForm(request.POST)
    back = reverse("item_detail", args=[item.pk])
    if not form.is_valid():
        return render(request, "refused.html", {"message": form_errors(form), "next_url": back}, status=400)
    version = form.cleaned_data["prompt_version"]
    try:
        job, started = regenerate_with_prompt(item_id=item.pk, prompt_version=version, actor=request.user)
    except NotAllowed as exc:
        messages.error(request, f"{item.product.sku}: nothing was started. {exc}")
        return redirect(back)
    if started:
        messages.success(
            request,
            f"{item.product.sku}: a new draft is asked for with prompt version {version} in job {job.reference}.",
        )
    else:
        messages.info(
            request,
            f"{item.product.sku} was regenerated with prompt version {version} already: job {job.reference}.",
        )
    return redirect("job_detail", job.pk)
