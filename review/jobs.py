"""Jobs: the dashboard of all jobs and one job's page."""

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET
from django_htmx.http import HttpResponseStopPolling

from ledger.models import Job

from .common import WORKING_JOB_STATES, HtmxHttpRequest, progress_of, state_counts, wants_partial
from .forms import ItemFilterForm
from .permissions import VIEWERS, role_required

JOBS_PER_PAGE = 25
ITEMS_PER_PAGE = 50


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
