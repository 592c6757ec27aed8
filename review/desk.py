"""The review desk (SPEC §8): one draft at a time beside its source revision, compared word by word
with the text published now, and the decision on it. A decision sent with htmx answers with what
happened to that draft and the next one to decide on; without JavaScript, the page it came from.
The same approve and reject answer the item page's forms. `review/?mode=list` is the list
(`review_list.py`)."""

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import wraps

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from ledger.actions import NotAllowed, claims, currency_problem
from ledger.actions.reviewing import (
    EditRefused,
    ReasonCodeUnknown,
    approve_version,
    last_decision,
    reject_version,
    undo_decision,
    undo_refusal,
)
from ledger.models import Item, PromptVersion, ReviewClaim
from ledger.states import ItemState

from .assignments import assigned_to
from .common import HtmxHttpRequest, form_errors, refused_page, wants_partial
from .forms import ApproveForm, RejectForm
from .paging import PageRefused, cursor_for, read_cursor, reversed_order, rows_beyond
from .permissions import APPROVERS, VIEWERS, has_role, role_required
from .queue import (
    QUEUE_ORDER,
    jobs_in_review,
    next_url,
    place_of,
    queue_url,
    review_cards,
    review_queue_items,
    waiting_count,
)
from .review_list import ReviewFilter, review_list


def cursor_key(token: str | None) -> list | None:
    """The queue key a cursor names, or None for no cursor or a bad one (then the position is used)."""
    if not token:
        return None
    try:
        direction, key = read_cursor(Item, QUEUE_ORDER, token)
    except PageRefused:
        return None
    return key if direction == "after" else None


@dataclass(frozen=True)
class DeskQueue:
    """The drafts a reviewer's desk goes through: every waiting draft (of the job, when one is
    chosen), or only those assigned to them ("my queue"); never a draft another reviewer holds."""

    job_id: int | None
    name: str  # "mine" or "all"
    mine: Q | None  # the reviewer's assignments; None: they have none
    reviewer: object

    @classmethod
    def of(cls, request: HttpRequest, place: dict) -> "DeskQueue":
        mine = assigned_to(request.user)
        name = place.get("queue") or ("mine" if mine is not None else "all")
        return cls(place.get("job"), name if mine is not None else "all", mine, request.user)

    @property
    def only_mine(self) -> bool:
        return self.name == "mine" and self.mine is not None

    def items(self, skip: frozenset[int] = frozenset()) -> QuerySet[Item]:
        items = review_queue_items(self.job_id)
        if self.only_mine:
            items = items.filter(self.mine)
        held = ReviewClaim.objects.held().exclude(reviewer=self.reviewer).values("item_id")
        items = items.exclude(pk__in=held)
        return items.exclude(pk__in=skip) if skip else items

    def count(self) -> int:
        return (
            review_queue_items(self.job_id).filter(self.mine).count()
            if self.only_mine
            else waiting_count(self.job_id)
        )

    def url(self, **params) -> str:
        return queue_url(job=self.job_id, queue=self.name if self.mine is not None else None, **params)


# How many drafts a desk tries to take, one after another, when other reviewers took each first.
CLAIM_TRIES = 5


def focus_context(
    request: HttpRequest,
    *,
    desk: DeskQueue,
    pos: int | None,
    after: str | None = None,
    decided: Item | None = None,
    outcome: str = "",
    error: str = "",
    refused_item: int | None = None,
    edited_text: str | None = None,
    skip: frozenset[int] = frozenset(),
    count: int | None = None,
) -> dict:
    """The draft at position `pos` of the queue (clamped to it), and what happened to the one decided on.

    With `after`, the cursor of the draft before it, the draft is the first one after that, read from
    the queue's index wherever it is; `pos` is then only shown, and may be None (not known: a draft
    opened by its item deep in the queue). Without it (the first draft, or a position typed in), the
    queue is counted into from its nearer end. The links to the next and previous drafts, and the
    place a decision comes back to, carry the cursor of the draft before theirs.

    A reviewer who may decide takes the hold on the draft shown (`ledger.actions.claims`); when
    another reviewer took it a moment before, the desk moves on to the next one."""
    job_id = desk.job_id
    queue = desk.items(skip)
    count = desk.count() if count is None else count
    key = cursor_key(after) if pos is None or pos > 1 else None
    if pos is not None or key is None:
        pos = min(max(pos or 1, 1), count)
    at: tuple | None = None
    if key is not None:
        at = (
            queue.filter(rows_beyond(Item, QUEUE_ORDER, key, backwards=False))
            .values_list("pk", "updated_at")
            .first()
        )
    if at is None and count:
        pos = pos or 1
        if pos - 1 <= count - pos:
            at = queue.values_list("pk", "updated_at")[pos - 1 : pos].first()
        else:
            backwards = queue.order_by(*reversed_order(QUEUE_ORDER))
            at = backwards.values_list("pk", "updated_at")[count - pos : count - pos + 1].first()
        if at is None:  # fewer than counted: others hold some of them
            at = queue.values_list("pk", "updated_at").first()
            pos = 1 if at is not None else pos
    can_decide = has_role(request.user, *APPROVERS)
    if at is not None and can_decide and not claims.claim_draft(item_id=at[0], reviewer=request.user):
        if len(skip) < CLAIM_TRIES:  # another desk took it first
            return focus_context(
                request,
                desk=desk,
                pos=pos,
                after=after,
                decided=decided,
                outcome=outcome,
                error=error,
                refused_item=refused_item,
                edited_text=edited_text,
                skip=skip | {at[0]},
                count=count,
            )
        at = None
    # The drafts before it, nearest first: the cursors of this place and of the previous one.
    before = []
    if at is not None and pos != 1:
        current = [at[1], at[0]]
        before = [
            [moment, pk]
            for pk, moment in queue.filter(rows_beyond(Item, QUEUE_ORDER, current, backwards=True))
            .order_by(*reversed_order(QUEUE_ORDER))
            .values_list("pk", "updated_at")[:2]
        ]
        if pos is None and len(before) < 2:
            pos = len(before) + 1  # near the start: known after all
    cursors = [cursor_for("after", [moment.isoformat(), pk]) for moment, pk in before]
    here = cursors[0] if cursors else None
    cards = review_cards(Item.objects.filter(pk=at[0])) if at is not None else []
    card = cards[0] if cards else None
    if card is not None:  # one draft: ask the ledger's own rule, as approving it will
        card = replace(card, currency=currency_problem(card.item))
    following = cursor_for("after", [at[1].isoformat(), at[0]]) if at is not None else None
    if pos is None:
        previous_url = desk.url(after=cursors[1]) if len(cursors) > 1 else desk.url()
        next_url = desk.url(after=following) if following else ""
    else:
        previous_url = (
            desk.url(pos=pos - 1, after=cursors[1] if len(cursors) > 1 else None) if pos > 1 else ""
        )
        next_url = desk.url(pos=pos + 1, after=following) if pos < count else ""
    undo = None
    if decided is not None and outcome:
        undo = undo_offer(request.user, decided)
    return {
        "card": card,
        "pos": pos,
        "count": count,
        "job_id": job_id,
        "desk": desk,
        "after": here,
        "previous_url": previous_url,
        "next_url": next_url,
        "return_to": desk.url(pos=pos, after=here),
        "decided": decided,
        "outcome": outcome,
        "undo": undo,
        "error": error if decided else "",
        # A refusal stays with its own draft's card, never on the next one shown (rule 15), with the
        # text the reviewer had typed when it was an edit.
        "card_error": error if refused_item and card and card.item.pk == refused_item else "",
        "edited_text": edited_text if refused_item and card and card.item.pk == refused_item else None,
        "can_decide": can_decide,
        "comments": list(card.item.comments.select_related("author")) if card else [],
        "rejection_reasons": (
            PromptVersion.objects.filter(pk=card.item.job.prompt_version_id)
            .values_list("rejection_reasons", flat=True)
            .first()
            if card
            else []
        ),
        "comment_token": uuid.uuid4(),
        "claim_seconds": settings.BATCHDESK_CLAIM_SECONDS,
    }


@dataclass(frozen=True)
class UndoOffer:
    """What the card of a decision just taken says of undoing it: until when it can be, or why not."""

    until: datetime | None
    refusal: str


def undo_offer(user, item: Item) -> UndoOffer:
    decision = last_decision(item, user)
    refusal = undo_refusal(item, decision)
    until = (
        decision.at + timedelta(seconds=settings.BATCHDESK_UNDO_SECONDS) if decision and not refusal else None
    )
    return UndoOffer(until, refusal)


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
    earlier = queue.filter(rows_beyond(Item, QUEUE_ORDER, key, backwards=True))
    previous = earlier.order_by(*reversed_order(QUEUE_ORDER)).values_list("updated_at", "pk").first()
    after = cursor_for("after", [previous[0].isoformat(), previous[1]]) if previous else None
    ahead = earlier.order_by()[:POSITION_COUNT_CAP].count()
    if ahead < POSITION_COUNT_CAP:
        return ahead + 1, after
    behind = (
        queue.filter(rows_beyond(Item, QUEUE_ORDER, key, backwards=False))
        .order_by()[:POSITION_COUNT_CAP]
        .count()
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
    desk = DeskQueue.of(request, place)
    if item_id := place.get("item"):
        item = get_object_or_404(Item, pk=item_id)
        found = place_in(job_id, item)
        if found is None:  # decided already: its own page says what became of it
            return redirect("item_detail", item.pk)
        pos, after = found
        desk = replace(desk, name="all")  # the draft asked for, wherever it is
    context = focus_context(request, desk=desk, pos=pos, after=after)
    if wants_partial(request) and not request.htmx.history_restore_request:
        return render(request, "review_queue.html#focus", context)
    context["jobs"] = jobs_in_review(job_id)
    return render(request, "review_queue.html", context)


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
    desk = DeskQueue.of(request, place)
    item = Item.objects.select_related("product").get(pk=item_id)
    # A draft another reviewer holds is not shown again here: the refusal is said on its own card.
    held = claims.holder_other_than(item.pk, request.user)
    still_waiting = None if outcome or held else place_in(job_id, item)
    if still_waiting:
        pos, after = still_waiting
        context = focus_context(
            request,
            desk=replace(desk, name="all"),
            pos=pos,
            after=after,
            error=error,
            refused_item=item.pk,
            edited_text=edited_text,
        )
    else:
        context = focus_context(
            request,
            desk=desk,
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
        return refused_page(request, message, next_url(request))
    messages.error(request, f"{item.product.sku}: {message}")
    return redirect(next_url(request))


def decided(request: HtmxHttpRequest, item: Item, outcome: str) -> HttpResponse:
    if wants_partial(request):
        return render_focus(request, item.pk, outcome=outcome)
    messages.success(request, f"{item.product.sku}: {outcome}.")
    return redirect(next_url(request))


def decision(form_class: type[ApproveForm] | type[RejectForm]) -> Callable:
    """A reviewer's decision on one item, posted from the desk or the item page: the view gets the item
    and its form's cleaned data. A form that does not validate is refused (400), and so is a decision
    the ledger does not allow in the item's state (409); nothing is changed then."""

    def decorator(decide: Callable[[HtmxHttpRequest, Item, dict], HttpResponse]) -> Callable:
        @require_POST
        @login_required
        @role_required(*APPROVERS)
        @wraps(decide)
        def view(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
            item = get_object_or_404(Item.objects.select_related("product"), pk=item_id)
            form = form_class(request.POST)
            if not form.is_valid():
                return refused(request, item, form_errors(form), status=400)
            try:
                return decide(request, item, form.cleaned_data)
            except NotAllowed as exc:
                return refused(request, item, str(exc), status=409)

        return view

    return decorator


@decision(ApproveForm)
def approve(request: HtmxHttpRequest, item: Item, data: dict) -> HttpResponse:
    try:
        approval = approve_version(
            item_id=item.pk,
            version_id=data["version_id"],
            version_hash=data["version_hash"],
            approver=request.user,
            content=data["content"],
            note=data["note"],
        )
    except EditRefused as exc:
        return refused(request, item, str(exc), status=400, edited_text=data["content"])
    outcome = "Approved with your edits — being applied" if approval.edited else "Approved — being applied"
    return decided(request, item, outcome)


@decision(RejectForm)
def reject(request: HtmxHttpRequest, item: Item, data: dict) -> HttpResponse:
    try:
        reject_version(
            item_id=item.pk,
            version_id=data["version_id"],
            reviewer=request.user,
            reason=data["reason"],
            reason_code=data["reason_code"],
        )
    except ReasonCodeUnknown as exc:
        return refused(request, item, str(exc), status=400)
    return decided(request, item, "Rejected")


@require_POST
@login_required
@role_required(*APPROVERS)
def undo(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    """Undo the reviewer's last decision on the item (SPEC §8): from the desk, the draft is shown again
    to decide anew; from the item page, its page. Refused (409) after the window or once applying
    started, saying why; nothing is changed then."""
    item = get_object_or_404(Item.objects.select_related("product"), pk=item_id)
    try:
        item = undo_decision(item_id=item.pk, actor=request.user)
    except NotAllowed as exc:
        if wants_partial(request):
            return render_focus(request, item.pk, error=str(exc), status=409)
        messages.error(request, f"{item.product.sku}: nothing was undone. {exc}")
        return redirect(next_url(request, reverse("item_detail", args=[item.pk])))
    if wants_partial(request):
        place = place_of(request.POST)
        found = place_in(place.get("job"), item)
        pos, after = found if found else (None, None)
        desk = replace(DeskQueue.of(request, place), name="all")
        context = focus_context(request, desk=desk, pos=pos, after=after)
        context["undone"] = item
        response = render(request, "review_queue.html#focus", context)
        response["HX-Replace-Url"] = context["return_to"]
        return response
    messages.success(
        request, f"{item.product.sku}: your decision was undone; the draft waits for review again."
    )
    return redirect(next_url(request, reverse("item_detail", args=[item.pk])))


@require_POST
@login_required
@role_required(*APPROVERS)
def keep_claim(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    """The open card renews its hold while its reviewer is at work (`review.js`): 204 while it is
    theirs; 409 when someone else has it now (the hold ran out while they were away), or when the
    draft no longer waits for review."""
    item = get_object_or_404(Item, pk=item_id)
    if item.state != ItemState.AWAITING_REVIEW:
        return HttpResponse("This draft no longer waits for review.", status=409, content_type="text/plain")
    if claims.claim_draft(item_id=item_id, reviewer=request.user):
        return HttpResponse(status=204)
    return HttpResponse(
        "Another reviewer has this draft open now (your hold ran out while you were away).",
        status=409,
        content_type="text/plain",
    )
