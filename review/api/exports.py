"""`GET /api/jobs/{id}/export?format=csv|jsonl` (SPEC §6): a job's outcome as a file, one row an item.
The rows and both formats are review/job_export.py's, which the job page's export buttons use too."""

from django.http import HttpRequest, HttpResponse

from ledger.models import Job

from ..job_export import BAD_FORMAT, export_response, requested_format
from ..permissions import VIEWERS
from .doors import BEARER_TOKEN, door
from .errors import ApiError, found_or_404


@door(BEARER_TOKEN, GET=VIEWERS)
def job_export(request: HttpRequest, job_id: int) -> HttpResponse:
    job = found_or_404(
        request, Job.objects.filter(pk=job_id).only("pk", "reference", "provider", "model"), "No job"
    )
    format = requested_format(request)
    if format is None:
        raise ApiError(400, "invalid", BAD_FORMAT, {"format": BAD_FORMAT})
    return export_response(request, job, format)
