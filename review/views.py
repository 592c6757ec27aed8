"""The screens (SPEC §8). Small function views: one URL, one context, and two renderings, the whole
page or, for an htmx request, one template partial of it."""

from collections import defaultdict
from dataclasses import dataclass

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseStopPolling
from django_htmx.middleware import HtmxDetails

from ledger.actions import NotAllowed, approve_version, reject_version
from ledger.models import GeneratedVersion, Item, Job, SourceRevision
from ledger.states import ItemState, JobState

from .forms import ApproveForm, ItemFilterForm, RejectForm
from .permissions import APPROVERS, VIEWERS, has_role, role_required

JOBS_PER_PAGE = 25
ITEMS_PER_PAGE = 50
CARDS_PER_PAGE = 20

# Jobs whose progress still moves on its own; the dashboard polls while one is on the page.
WORKING_JOB_STATES = frozenset({JobState.PREPARING, JobState.RUNNING})


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def wants_partial(request: HtmxHttpRequest) -> bool:
    return bool(request.htmx) and not request.htmx.boosted


# --- progress by state ---------------------------------------------------------------------


@dataclass(frozen=True)
class StateCount:
    state: str
    label: str
    count: int
    percent: str  # the width of its segment in a stacked bar


def state_counts(counts: dict[str, int]) -> list[StateCount]:
    """Counts in the order of the state table, leaving out states no item is in."""
    total = sum(counts.values())
    return [
        StateCount(state, ItemState(state).label, counts[state], f"{100 * counts[state] / total:.3f}")
        for state in ItemState.values
        if counts.get(state)
    ]


@dataclass(frozen=True)
class JobProgress:
    job: Job
    counts: list[StateCount]

    @property
    def item_count(self) -> int:
        return sum(c.count for c in self.counts)


def progress_of(jobs: list[Job]) -> list[JobProgress]:
    """Item counts by state for many jobs in one GROUP BY query."""
    rows = Item.objects.filter(job__in=jobs).order_by().values("job", "state").annotate(n=Count("id"))
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    for row in rows:
        counts[row["job"]][row["state"]] = row["n"]
    return [JobProgress(job, state_counts(counts[job.pk])) for job in jobs]


def fields_of(revision: SourceRevision) -> list[tuple[str, object]]:
    """A revision's fields as pairs: a template looking up `fields.items` would find a field named "items"."""
    return list(revision.fields.items())


# --- pages ---------------------------------------------------------------------------------


@require_GET
@login_required
@role_required(*VIEWERS)
def dashboard(request: HtmxHttpRequest) -> HttpResponse:
    page = Paginator(Job.objects.order_by("-created_at", "-id"), JOBS_PER_PAGE).get_page(
        request.GET.get("page")
    )
    jobs = list(page.object_list)
    polling = any(job.state in WORKING_JOB_STATES for job in jobs)
    context = {"page": page, "progress": progress_of(jobs), "polling": polling}
    if wants_partial(request):
        response = render(request, "dashboard.html#jobs", context)
        if not polling:
            return HttpResponseStopPolling(response.content)
        return response
    return render(request, "dashboard.html", context)


@require_GET
@login_required
@role_required(*VIEWERS)
def job_detail(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(Job.objects.select_related("owner", "prompt_version"), pk=job_id)
    items = job.items.select_related("product", "source_revision").order_by("id")
    filters = ItemFilterForm(request.GET)
    if filters.is_valid():
        if state := filters.cleaned_data["state"]:
            items = items.filter(state=state)
        if sku := filters.cleaned_data["sku"]:
            items = items.filter(product__sku__icontains=sku)
    context = {
        "job": job,
        "counts": state_counts(job.items.counts_by_state()),
        "submissions": job.submissions.order_by("id"),
        "filters": filters,
        "page": Paginator(items, ITEMS_PER_PAGE).get_page(request.GET.get("page")),
    }
    return render(request, "job_detail.html", context)


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
