"""Drafts: an item's page and the review queue (SPEC §8). Small function views: one URL, one context, and two renderings, the whole
page or, for an htmx request, one template partial of it."""

from dataclasses import dataclass

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from ledger.actions import NotAllowed, approve_version, reject_version
from ledger.models import GeneratedVersion, Item
from ledger.states import ItemState

from .common import HtmxHttpRequest, fields_of, wants_partial
from .forms import ApproveForm, RejectForm
from .permissions import APPROVERS, VIEWERS, has_role, role_required

CARDS_PER_PAGE = 20


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
    latest = versions[-1] if versions else None
    product = item.product
    current = product.current_revision if product.current_revision_id != item.source_revision_id else None
    context = {
        "item": item,
        "product": product,
        "source_fields": fields_of(item.source_revision),
        "current_revision": current,
        "current_fields": fields_of(current) if current else [],
        "versions": versions,
        "latest": latest,
        "approvals": item.approvals.select_related("approved_by", "version").order_by("approved_at", "id"),
        "attempts": item.destination_attempts.select_related("version").order_by("started_at", "id"),
        "events": item.events.order_by("id"),
        "can_decide": (
            item.state == ItemState.AWAITING_REVIEW
            and latest is not None
            and has_role(request.user, *APPROVERS)
        ),
    }
    return render(request, "item_detail.html", context)


# --- review queue --------------------------------------------------------------------------


@dataclass(frozen=True)
class ReviewCard:
    """An item waiting for a decision and the draft to decide on: its latest version."""

    item: Item
    version: GeneratedVersion | None

    @property
    def source_fields(self) -> list[tuple[str, object]]:
        return fields_of(self.item.source_revision)


def review_cards(items: QuerySet[Item]) -> list[ReviewCard]:
    latest = GeneratedVersion.objects.filter(item=OuterRef("pk")).order_by("-number").values("pk")[:1]
    items = list(
        items.select_related("job", "product", "source_revision").annotate(latest_version_id=Subquery(latest))
    )
    versions = GeneratedVersion.objects.in_bulk(i.latest_version_id for i in items if i.latest_version_id)
    return [ReviewCard(item, versions.get(item.latest_version_id)) for item in items]


@require_GET
@login_required
@role_required(*VIEWERS)
def review_queue(request: HtmxHttpRequest) -> HttpResponse:
    queue = Item.objects.awaiting_review().order_by("updated_at", "id")
    page = Paginator(queue, CARDS_PER_PAGE).get_page(request.GET.get("page"))
    context = {
        "page": page,
        "cards": review_cards(page.object_list),
        "can_decide": has_role(request.user, *APPROVERS),
        "return_to": request.get_full_path(),
    }
    return render(request, "review_queue.html", context)


def render_card(
    request: HtmxHttpRequest, item_id: int, *, outcome: str = "", error: str = "", status: int = 200
) -> HttpResponse:
    """One review card as it is now, to replace the one the reviewer acted on."""
    [card] = review_cards(Item.objects.filter(pk=item_id))
    context = {
        "card": card,
        "outcome": outcome,
        "error": error,
        "can_decide": has_role(request.user, *APPROVERS),
        "return_to": next_url(request),
    }
    return render(request, "review_queue.html#card", context, status=status)


def next_url(request: HttpRequest) -> str:
    """Where a plain form post returns to: the page it came from, if it is ours."""
    url = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(
        url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return url
    return reverse("review_queue")


def form_errors(form: forms.Form) -> str:
    return " ".join(str(error) for errors in form.errors.values() for error in errors)


def refused(request: HtmxHttpRequest, item: Item, message: str, *, status: int) -> HttpResponse:
    """Nothing was changed: say why, in the card (htmx), on an error page (bad input) or as a message."""
    if wants_partial(request):
        return render_card(request, item.pk, error=message, status=status)
    if status == 400:
        return render(
            request, "refused.html", {"message": message, "next_url": next_url(request)}, status=400
        )
    messages.error(request, f"{item.product.sku}: {message}")
    return redirect(next_url(request))


def decided(request: HtmxHttpRequest, item: Item, outcome: str) -> HttpResponse:
    if wants_partial(request):
        return render_card(request, item.pk, outcome=outcome)
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
        approve_version(
            item_id=item.pk,
            version_id=form.cleaned_data["version_id"],
            version_hash=form.cleaned_data["version_hash"],
            approver=request.user,
            content=form.cleaned_data["content"],
            note=form.cleaned_data["note"],
        )
    except NotAllowed as exc:
        return refused(request, item, str(exc), status=409)
    return decided(request, item, "Approved — being applied")


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
