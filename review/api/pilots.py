"""`GET /api/jobs/{id}/pilot` (SPEC §6): a pilot's report, or 409 with the decisions it still needs;
`POST /api/jobs/{id}/pilot/decision`: go or no-go on it (`ledger.actions.pilot_decisions`)."""

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse

from ledger.actions.pilot_decisions import AlreadyDecided, NotProjectable, decide_pilot
from ledger.models import Job
from ledger.pilots.accuracy import decision_json
from ledger.pilots.report import MIN_DECISIONS, Report, pilot_of

from ..permissions import APPROVERS, VIEWERS
from .doors import BEARER_TOKEN, door
from .errors import ApiError, found_or_404
from .inputs import PilotDecisionBody


def pilot_or_404(request: HttpRequest, job_id: int):
    job = found_or_404(request, Job.objects.filter(pk=job_id), "No job")
    pilot = pilot_of(job)
    if pilot is None:
        raise ApiError(404, "not_a_pilot", f"Job {job.pk} is not a pilot: it was started without `pilot`")
    return pilot


def with_job_url(request: HttpRequest, decision: dict | None) -> dict | None:
    """The decision as the report gives it, its full job with the job's API address."""
    if decision is not None and decision["full_job"] is not None:
        job_id = decision["full_job"]["id"]
        decision["full_job"]["url"] = request.build_absolute_uri(reverse("api:job", args=[job_id]))
    return decision


@door(BEARER_TOKEN, GET=VIEWERS)
def pilot_report(request: HttpRequest, job_id: int) -> HttpResponse:
    report = Report(pilot_or_404(request, job_id))
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
    body = report.as_json()
    with_job_url(request, body["decision"])
    return JsonResponse(body)


@door(BEARER_TOKEN, POST=APPROVERS)
def pilot_decision(request: HttpRequest, job_id: int) -> HttpResponse:
    """Go or no-go, once: 201 with the decision and the full job go started."""
    body = PilotDecisionBody.read(request)
    pilot = pilot_or_404(request, job_id)
    wanted = body.checked()
    try:
        made = decide_pilot(
            pilot_id=pilot.pk,
            decision=wanted["decision"],
            by=request.user,
            note=wanted["note"] or "",
            budget=wanted["budget"],
        )
    except AlreadyDecided as refusal:
        raise ApiError(409, "already_decided", str(refusal)) from None
    except NotProjectable as refusal:
        raise ApiError(409, "not_enough_decisions", str(refusal)) from None
    decision = with_job_url(request, decision_json(made))
    full_job = decision.pop("full_job")
    return JsonResponse({"decision": decision, "full_job": full_job}, status=201)
