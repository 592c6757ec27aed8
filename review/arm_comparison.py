"""The blind comparison of a pilot's arms (SPEC §8; issue 30 point 5): two arms' drafts of one product
side by side, in an order drawn at random and kept on the server (`ledger.actions.comparing`), with
nothing on the page that says which arm wrote which: no job, model, prompt version or arm. Catalogue
owners and admins prefer the left, the right, both or neither (keys 1, 2, b, n; real forms without
JavaScript, swapped in place by htmx); operators see the page but decide nothing. The arms report
(`/jobs/{id}/pilot`) counts the answers."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from ledger.actions.comparing import AlreadyCompared, record_preference, show_next_pair
from ledger.actions.core import NotAllowed
from ledger.models import ArmPreference, Job, Pilot
from ledger.pilots.comparison import first_arm

from .common import HtmxHttpRequest, fields_of, wants_partial
from .permissions import APPROVERS, VIEWERS, has_role, role_required
from .pilots import pilot_or_404

SIDE_WORDS = {
    "left": "the left draft",
    "right": "the right draft",
    "both": "both drafts",
    "neither": "neither draft",
}


def group_or_404(job_id: int) -> tuple[Job, Pilot]:
    """The job and its pilot's first arm; 404 unless the job is an arm of a pilot of several arms."""
    job, pilot = pilot_or_404(job_id)
    if pilot.arms <= 1:
        raise Http404("This pilot has one arm: there is nothing to compare")
    return job, first_arm(pilot)


def comparison_context(request: HtmxHttpRequest, job: Job, first: Pilot, **extra) -> dict:
    may_decide = has_role(request.user, *APPROVERS)
    comparison = (
        show_next_pair(first=first, reviewer=request.user) if may_decide and first.same_sample else None
    )
    context = {
        "job": job,
        "same_sample": first.same_sample,
        "may_decide": may_decide,
        "comparison": comparison,
        "compared": ArmPreference.objects.filter(pilot=first).exclude(preference="").count(),
        "compared_by_you": (
            ArmPreference.objects.filter(pilot=first, reviewer=request.user).exclude(preference="").count()
        ),
        **extra,
    }
    if comparison is not None:
        versions = [comparison.version_a, comparison.version_b]
        left, right = versions if comparison.a_on_left else versions[::-1]
        revision = left.item.source_revision
        context.update(left=left, right=right, product=comparison.product, revision=revision)
        context["fields"] = fields_of(revision)
    return context


@require_GET
@login_required
@role_required(*VIEWERS)
def pilot_compare(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    job, first = group_or_404(job_id)
    template = "pilot_compare.html#comparison" if wants_partial(request) else "pilot_compare.html"
    return render(request, template, comparison_context(request, job, first))


@require_POST
@login_required
@role_required(*APPROVERS)
def pilot_compare_answer(request: HtmxHttpRequest, job_id: int, comparison_id: int) -> HttpResponse:
    """One answer, recorded once: sent again (a double click, Back, a refresh), it changes nothing and
    says so. Without htmx, back to the comparison page for the next pair."""
    job, first = group_or_404(job_id)
    side = request.POST.get("side", "")
    outcome, status = "", 200
    try:
        record_preference(first=first, comparison_id=comparison_id, reviewer=request.user, side=side)
    except ArmPreference.DoesNotExist:
        raise Http404("No such comparison was shown to you") from None
    except AlreadyCompared:
        outcome = "This pair was compared already: nothing more was recorded."
    except NotAllowed:
        outcome, status = "Nothing was recorded: say left (1), right (2), both (b) or neither (n).", 400
    else:
        outcome = f"Recorded: you preferred {SIDE_WORDS[side]}."
    if status == 200 and not wants_partial(request):
        messages.success(request, outcome)
        return redirect("pilot_compare", job.pk)
    template = "pilot_compare.html#comparison" if wants_partial(request) else "pilot_compare.html"
    context = comparison_context(request, job, first, outcome=outcome, refused=status == 400)
    return render(request, template, context, status=status)
