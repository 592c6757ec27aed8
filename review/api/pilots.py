"""`GET /api/jobs/{id}/pilot` (SPEC §6): a pilot's report, or 409 with the decisions it still needs."""

from django.http import HttpRequest, HttpResponse, JsonResponse

from ledger.models import Job
from ledger.pilots.report import MIN_DECISIONS, Report, pilot_of

from ..permissions import VIEWERS
from .doors import BEARER_TOKEN, door
from .errors import ApiError, found_or_404


@door(BEARER_TOKEN, GET=VIEWERS)
def pilot_report(request: HttpRequest, job_id: int) -> HttpResponse:
    job = found_or_404(request, Job.objects.filter(pk=job_id), "No job")
    pilot = pilot_of(job)
    if pilot is None:
        raise ApiError(404, "not_a_pilot", f"Job {job.pk} is not a pilot: it was started without `pilot`")
    report = Report(pilot)
    if not report.decisions.enough:
        made, needed = report.decisions.made, report.decisions.needed
        message = (
            f"The pilot needs {needed} more decision{'s' if needed != 1 else ''} on its drafts before it can "
            f"project the scope: {MIN_DECISIONS} decided drafts, or every draft of a smaller pilot decided "
            f"({made} so far)"
        )
        body = ApiError(409, "not_enough_decisions", message).response_body()
        body["decisions"] = {"made": made, "needed": needed, "threshold": MIN_DECISIONS}
        return JsonResponse(body, status=409)
    return JsonResponse(report.as_json())
