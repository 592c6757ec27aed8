"""A pilot's report as a screen (SPEC §8 `/jobs/{id}/pilot`, printable): the same report as
`GET /api/jobs/{id}/pilot` (`ledger.pilots.report`), and, until enough drafts are decided to project,
what has been measured so far and how many decisions are still needed."""

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from ledger.models import Job
from ledger.pilots.report import MIN_DECISIONS, Report, pilot_of

from .common import HtmxHttpRequest
from .permissions import VIEWERS, role_required


@require_GET
@login_required
@role_required(*VIEWERS)
def pilot_report(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(Job.objects.select_related("owner", "prompt_version"), pk=job_id)
    pilot = pilot_of(job)
    if pilot is None:
        raise Http404("This job is not a pilot")
    context = {"job": job, "report": Report(pilot).as_json(), "threshold": MIN_DECISIONS}
    return render(request, "pilot_report.html", context)
