"""A pilot's report as a screen (SPEC §8 `/jobs/{id}/pilot`, printable): the same report as
`GET /api/jobs/{id}/pilot` (`ledger.pilots.report`), and, until enough drafts are decided to project,
what has been measured so far and how many decisions are still needed. Catalogue owners and admins
decide go or no-go on it (`ledger.actions.pilot_decisions`): the form says first what go would start."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from ledger.actions.core import NotAllowed
from ledger.actions.pilot_decisions import AlreadyDecided, decide_pilot, decided, plan_full_job
from ledger.models import Job, Pilot, PilotVerdict
from ledger.pilots.report import MIN_DECISIONS, Report, pilot_of

from .common import HtmxHttpRequest
from .permissions import APPROVERS, VIEWERS, has_role, role_required
from .pilot_forms import PilotDecisionForm


def pilot_or_404(job_id: int) -> tuple[Job, Pilot]:
    job = get_object_or_404(Job.objects.select_related("owner", "prompt_version"), pk=job_id)
    pilot = pilot_of(job)
    if pilot is None:
        raise Http404("This job is not a pilot")
    return job, pilot


@require_GET
@login_required
@role_required(*VIEWERS)
def pilot_report(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    job, pilot = pilot_or_404(job_id)
    report = Report(pilot)
    may_decide = has_role(request.user, *APPROVERS)
    open_to_decide = report.decisions.enough and decided(pilot) is None
    context = {
        "job": job,
        "report": report.as_json(),
        "threshold": MIN_DECISIONS,
        "may_decide": may_decide,
        "decision_form": PilotDecisionForm() if may_decide and open_to_decide else None,
        "go_would_start": plan_full_job(report) if may_decide and open_to_decide else None,
    }
    return render(request, "pilot_report.html", context)


@require_POST
@login_required
@role_required(*APPROVERS)
def pilot_decision(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    """Go or no-go, then back to the report. Sent twice (Back, then the form again), it acts once."""
    job, pilot = pilot_or_404(job_id)
    form = PilotDecisionForm(request.POST)
    if not form.is_valid():
        words = " ".join(error for errors in form.errors.values() for error in errors)
        messages.error(request, f"Nothing was decided: {words}")
        return redirect("pilot_report", job.pk)
    try:
        made = decide_pilot(
            pilot_id=pilot.pk,
            decision=form.cleaned_data["decision"],
            by=request.user,
            note=form.cleaned_data["note"],
            budget=form.cleaned_data["budget"],
        )
    except AlreadyDecided:
        messages.info(request, "The pilot is already decided: nothing more was done.")
    except NotAllowed as refusal:
        messages.error(request, f"Nothing was decided: {refusal}.")
    else:
        if made.decision == PilotVerdict.GO:
            messages.success(request, f"Go: the full job {made.full_job.reference} has started.")
        else:
            messages.success(request, "No-go recorded: nothing was started.")
    return redirect("pilot_report", job.pk)
