"""Jobs (SPEC §6): `GET|POST /api/jobs`, a job, its items and submissions a page at a time, and what
may be done to it: cancel, set its budget, resume it."""

from collections.abc import Callable

from django.db import IntegrityError
from django.http import HttpRequest, HttpResponse, JsonResponse

from ledger.actions.core import NotAllowed
from ledger.actions.jobs import create_job, create_pilot_arms, resume_job, set_budget
from ledger.actions.operating import cancel_job
from ledger.catalogue import SKU_PATTERN
from ledger.models import ItemTally, Job, Pilot, Submission
from ledger.states import ItemState

from ..job_forms import UNREADABLE, ApiJobForm
from ..permissions import APPROVERS, OPERATOR, VIEWERS, may_cancel, may_spend
from ..pilot_forms import same_pilot
from .doors import BEARER_TOKEN, door
from .errors import ApiError, found_or_404, invalid, not_found
from .inputs import BudgetBody, read_json
from .shapes import item_json, items, job_created_json, jobs_json, page_of, submission_json

JOBS_PER_PAGE = 25
ITEMS_PER_PAGE = 50
SUBMISSIONS_PER_PAGE = 100

JOB_FIELDS = (
    "reference",
    "task",
    "provider",
    "model",
    "prompt_version",
    "skus",
    "destination",
    "unit_size",
    "budget",
    "pilot",
    "notify_url",
)


@door(BEARER_TOKEN, GET=VIEWERS, POST=APPROVERS)
def job_list(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        return start_job(request)
    rows = Job.objects.select_related("owner", "prompt_version")
    return JsonResponse(
        page_of(
            request,
            rows,
            JOBS_PER_PAGE,
            lambda page: jobs_json(request, page),
            order=["-created_at", "-id"],
            count=Job.objects.count,
        )
    )


def same_work(job: Job, wanted: dict, owner) -> str | None:
    """Why an existing job is not the one asked for, or None when it is.

    Nothing about the request is stored, so it is compared with the job itself. A request that
    leaves out `skus` (every active product) or `prompt_version` (the current one) is compared on the
    other fields only: the catalogue and the prompts may have changed since the job was made."""
    if job.owner_id != owner.pk:
        return f"The reference {job.reference!r} is already used by another person's job"
    differences = [
        name
        for name, value in (
            ("task", job.task),
            ("provider", job.provider),
            ("model", job.model),
            ("destination", job.destination),
            ("unit_size", job.unit_size),
            ("notify_url", job.notify_url),
        )
        if wanted[name] != value
    ]
    if wanted["prompt_version"] is not None and wanted["prompt_version"] != job.prompt_version.version:
        differences.append("prompt_version")
    pilot = Pilot.objects.filter(job=job).first()
    if wanted["skus"] is not None:
        # A pilot's items are a sample: its scope is the SKUs it was asked for.
        if pilot is not None:
            skus = set(pilot.scope_skus) if pilot.scope_skus is not None else None
        else:
            skus = set(job.items.values_list("product__sku", flat=True).distinct())
        if wanted["skus"] is UNREADABLE or skus != set(wanted["skus"]):
            differences.append("skus")
    if not same_pilot(pilot, wanted["pilot"]):
        differences.append("pilot")
    if differences:
        return f"The reference {job.reference!r} is already used by a job with a different {', '.join(differences)}"
    return None


def replay(request: HttpRequest, reference: str, wanted: dict) -> HttpResponse | None:
    """Answer a repeated `POST /api/jobs`: 200 with the same job, or 409 for different work."""
    job = Job.objects.select_related("prompt_version").filter(reference=reference).first()
    if job is None:
        return None
    if clash := same_work(job, wanted, request.user):
        return ApiError(409, "reference_in_use", clash, {"reference": clash}).response()
    return JsonResponse(job_created_json(request, job), status=200)


def start_job(request: HttpRequest) -> HttpResponse:
    data = read_json(request, allowed=JOB_FIELDS)
    form = ApiJobForm(data)
    valid = form.is_valid()
    # A repeated request is answered from the job it made, whatever the catalogue says now.
    wanted = form.wanted()
    if (reference := form.cleaned_data.get("reference")) and (repeated := replay(request, reference, wanted)):
        return repeated
    if not valid:
        raise invalid(form.problems())
    try:
        if form.arms:
            jobs = create_pilot_arms(
                owner=request.user, skus=form.cleaned_data["skus"], arms=form.arms, **form.job_fields()
            )
            return JsonResponse(
                {
                    **job_created_json(request, jobs[0]),
                    "arms": [job_created_json(request, arm) for arm in jobs],
                },
                status=202,
            )
        job = create_job(owner=request.user, skus=form.cleaned_data["skus"], **form.job_fields())
    except (IntegrityError, NotAllowed):
        # Another request with this reference won the race: answer as its repeat.
        if repeated := replay(request, form.cleaned_data["reference"], wanted):
            return repeated
        raise
    return JsonResponse(job_created_json(request, job), status=202)


@door(BEARER_TOKEN, GET=VIEWERS)
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    found = found_or_404(
        request, Job.objects.select_related("owner", "prompt_version").filter(pk=job_id), "No job"
    )
    return JsonResponse(jobs_json(request, [found])[0])


@door(BEARER_TOKEN, POST=(OPERATOR, *APPROVERS))
def cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    read_json(request, allowed=())
    found = found_or_404(
        request, Job.objects.filter(pk=job_id).select_related("owner", "prompt_version"), "No job"
    )
    if not may_cancel(request.user, found):
        raise ApiError(403, "forbidden", "Only operators, or the person who started the job, may cancel it")
    outcome = cancel_job(job_id=found.pk, actor=request.user)
    found.refresh_from_db()
    return JsonResponse(
        {
            **jobs_json(request, [found])[0],
            "items_cancelled": outcome["items_cancelled"],
            "batches_to_stop": outcome["batches_to_stop"],
        }
    )


@door(BEARER_TOKEN, POST=APPROVERS)
def budget(request: HttpRequest, job_id: int) -> HttpResponse:
    """`{budget}` in the business currency: sets or raises the job's budget; a job paused by its
    budget goes on."""
    body = BudgetBody.read(request)
    found = found_or_404(request, Job.objects.filter(pk=job_id), "No job")
    if not may_spend(request.user, found):
        raise ApiError(
            403, "forbidden", "Only the person who started the job, or an admin, may change its budget"
        )
    amount = body.checked()["budget"]
    try:
        job = set_budget(found.pk, amount, actor=request.user)
    except NotAllowed as exc:
        raise ApiError(409, "not_allowed", str(exc), {"budget": str(exc)}) from None
    job = Job.objects.select_related("owner", "prompt_version").get(pk=job.pk)
    return JsonResponse(jobs_json(request, [job])[0])


@door(BEARER_TOKEN, POST=APPROVERS)
def resume(request: HttpRequest, job_id: int) -> HttpResponse:
    """A paused job goes on (after a billing refusal, once the account can pay again)."""
    read_json(request, allowed=())
    found = found_or_404(request, Job.objects.filter(pk=job_id), "No job")
    if not may_spend(request.user, found):
        raise ApiError(403, "forbidden", "Only the person who started the job, or an admin, may resume it")
    resume_job(found.pk, actor=request.user)  # a refusal is the door's 409
    job = Job.objects.select_related("owner", "prompt_version").get(pk=found.pk)
    return JsonResponse(jobs_json(request, [job])[0])


@door(BEARER_TOKEN, GET=VIEWERS)
def job_items(request: HttpRequest, job_id: int) -> HttpResponse:
    if not Job.objects.filter(pk=job_id).exists():
        return not_found(request, "No job")
    rows = items().filter(job_id=job_id)
    by_state = ItemTally.objects.filter(job_id=job_id).counts_by_state()
    count: int | Callable[[], int] = sum(by_state.values())
    if state := request.GET.get("state"):
        if state not in ItemState.values:
            raise invalid({"state": "not a state; one of " + ", ".join(ItemState.values)})
        rows = rows.filter(state=state)
        count = by_state.get(state, 0)
    if sku := request.GET.get("sku"):
        if not SKU_PATTERN.fullmatch(sku):
            raise invalid({"sku": "not a valid SKU"})
        # One product: its items in this job are few, and counted.
        rows = rows.filter(product__sku=sku)
        count = rows.count
    return JsonResponse(
        page_of(
            request,
            rows,
            ITEMS_PER_PAGE,
            lambda page: [item_json(request, i) for i in page],
            order=["id"],
            count=count,
        )
    )


@door(BEARER_TOKEN, GET=VIEWERS)
def job_submissions(request: HttpRequest, job_id: int) -> HttpResponse:
    """Every submission of the job, oldest first, a page at a time."""
    if not Job.objects.filter(pk=job_id).exists():
        return not_found(request, "No job")
    rows = Submission.objects.filter(job_id=job_id)
    return JsonResponse(
        page_of(
            request,
            rows,
            SUBMISSIONS_PER_PAGE,
            lambda page: [submission_json(s) for s in page],
            order=["id"],
            count=rows.count,
        )
    )
