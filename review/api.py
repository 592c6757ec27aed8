"""The JSON API (SPEC §6) and the Prometheus metrics.

Every call names its user with `Authorization: Bearer <token>` (`manage.py create_api_token`);
a session cookie alone authenticates nothing here, so the views need no CSRF protection.
Who may do what, by role (SPEC §8; admins and superusers may do everything):
- reading, and `/metrics`: any role;
- creating jobs, approving and rejecting, revising and withdrawing products, making a prompt version
  current: `catalogue_owner`;
- retrying and cancelling: `operator`; a catalogue owner may also cancel a job they own;
- `/api/health` needs no token and says nothing about the work itself.
Errors are `{"error": {"code", "message", "fields"}}`: 400 for bad input (each bad field named
in `fields`), 401, 403, 404, 405, and 409 when the ledger refuses a change in the current state
or a job reference is reused for different work; 500 `internal_error` for a fault of ours, whose
traceback is logged and never sent.
"""

import json
import logging
import re
from collections.abc import Callable, Iterable
from datetime import timedelta
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, InvalidOperation
from functools import wraps
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, IntegrityError, connection
from django.db.models import Count, Min, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse
from django.utils import timezone
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt
from django_q.brokers import get_broker

from ledger.actions import (
    NotAllowed,
    approve_version,
    cancel_job,
    create_job,
    create_pilot_arms,
    reject_version,
    resume_job,
    retry_item,
    set_budget,
    withdraw_product,
)
from ledger.actions.prompts import PROMPT_TASK_PATTERN, make_prompt_current
from ledger.actions.reviewing import EditRefused
from ledger.catalogue import (
    MAX_RECORD_BYTES,
    SKU_PATTERN,
    check_fields,
    check_sku,
    check_title,
    normalise_keys,
    revise_product,
)
from ledger.drafts.json_values import refuse_json_constant, text_problem, unique_json_keys
from ledger.health import collector_stalled, last_poll_at, units_failing_to_record
from ledger.lifecycle.deadlines import collection_at_risk
from ledger.models import (
    ApiToken,
    AttemptOutcome,
    CurrentPromptChoice,
    DestinationAttempt,
    Event,
    GeneratedVersion,
    Item,
    ItemTally,
    Job,
    Pilot,
    Product,
    ProductStatus,
    PromptVersion,
    Submission,
)
from ledger.money import budgets, pricing
from ledger.money.currency import PROVIDER_CURRENCY, in_business_currency
from ledger.notices.notifications import undelivered
from ledger.providers import configured_provider_names
from ledger.states import ItemState, JobState, SubmissionState, needs_attention

from .forms import MAX_CONTENT_LENGTH, MAX_NOTE_LENGTH
from .job_forms import UNREADABLE, ApiJobForm
from .operations import attention_by_provider
from .paging import PageRefused, keyset_page
from .permissions import APPROVERS, OPERATOR, VIEWERS, has_role, may_cancel, may_spend
from .pilot_forms import same_pilot
from .recipients import shown_notify_url

log = logging.getLogger(__name__)

JOBS_PER_PAGE = 25
ITEMS_PER_PAGE = 50
# A job shows its first submissions (by id) inline; `submissions_url` pages through all of them
# (a million items in units of 500, a size a job may ask for, are 2,000 submissions).
SUBMISSIONS_SHOWN = 100
SUBMISSIONS_PER_PAGE = 100
OPERATORS = (OPERATOR,)
# A token used again within this time is not written again: reading stays free of writes.
LAST_USED_PRECISION = timedelta(minutes=1)


# --- errors --------------------------------------------------------------------------------


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, fields: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.fields = status, code, message, fields or {}

    def response_body(self) -> dict:
        return {"error": {"code": self.code, "message": self.message, "fields": self.fields}}

    def response(self) -> JsonResponse:
        return JsonResponse(self.response_body(), status=self.status)


def invalid(fields: dict[str, str]) -> ApiError:
    return ApiError(400, "invalid", "Some fields are not valid: " + ", ".join(fields), fields)


def not_found(request: HttpRequest, what: str = "Nothing") -> JsonResponse:
    return ApiError(404, "not_found", f"{what} found at {request.path}").response()


def server_error_response() -> JsonResponse:
    return ApiError(500, "internal_error", "Something went wrong on our side; it has been logged.").response()


# --- who is calling ------------------------------------------------------------------------


def token_user(request: HttpRequest):
    """The active user whose unexpired, unrevoked token the request carries, or None. Cookies are never
    looked at."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > 256:
        return None
    now = timezone.now()
    found = (
        ApiToken.objects.usable(now).select_related("user").filter(token_hash=ApiToken.hash(token)).first()
    )
    if found is None or not found.user.is_active:
        return None
    if found.last_used_at is None or now - found.last_used_at > LAST_USED_PRECISION:
        ApiToken.objects.filter(pk=found.pk).update(last_used_at=now)
    return found.user


def endpoint(**roles_by_method: tuple[str, ...]) -> Callable:
    """An API view: the methods it answers, the roles each needs, and errors as JSON."""

    def decorator(view: Callable) -> Callable:
        @csrf_exempt
        @wraps(view)
        def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            try:
                roles = roles_by_method.get(request.method or "")
                if roles is None:
                    error = ApiError(405, "method_not_allowed", f"{request.method} is not allowed here")
                    response = error.response()
                    response["Allow"] = ", ".join(roles_by_method)
                    return response
                user = token_user(request)
                if user is None:
                    response = ApiError(
                        401, "unauthenticated", "Send a valid API token: Authorization: Bearer <token>"
                    ).response()
                    response["WWW-Authenticate"] = 'Bearer realm="batchdesk"'
                    return response
                # Whatever the session said, this request acts as the token's user.
                request.user = user
                if not has_role(user, *roles):
                    raise ApiError(403, "forbidden", "Your role does not allow this")
                return view(request, *args, **kwargs)
            except ApiError as error:
                return error.response()
            except NotAllowed as refusal:
                return ApiError(409, "not_allowed", str(refusal)).response()
            except Http404:
                return not_found(request)
            except Exception:
                # A fault of ours, not of the request: the traceback goes to the log, never to the caller.
                log.exception("Unexpected error in %s %s", request.method, request.path)
                return server_error_response()

        return wrapped

    return decorator


# --- reading input -------------------------------------------------------------------------


def read_json(request: HttpRequest, *, allowed: Iterable[str] | None = None) -> dict[str, Any]:
    """The body as a JSON object ({} when empty). With `allowed`, any other key is refused: a
    misspelt optional field must not silently mean "use the default"."""
    try:
        raw = request.body
    except RequestDataTooBig:
        raise ApiError(400, "too_large", "The request body is too large") from None
    if not raw.strip():
        data: object = {}
    else:
        try:
            data = json.loads(raw, object_pairs_hook=unique_json_keys, parse_constant=refuse_json_constant)
        except (ValueError, RecursionError) as error:
            raise ApiError(400, "malformed_json", f"The body is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "malformed_json", "The body must be a JSON object")
    if unstorable := unstorable_text(data):
        raise invalid(unstorable)
    if allowed is not None:
        allowed = set(allowed)
        unknown = {key: "not a known field" for key in data if key not in allowed}
        if unknown:
            raise invalid(unknown)
    return data


def unstorable_text(data: dict) -> dict[str, str]:
    """Each field of the body holding, anywhere inside it, a text PostgreSQL cannot store: a NUL, or a
    lone surrogate (JSON lets `"\\ud800"` be written; it is no character). Checked once for every
    endpoint, before any field is used; a bad key is named `body`, since it cannot be shown as itself."""
    problems: dict[str, str] = {}
    for name, value in data.items():
        field = "body" if text_problem(name) else name
        pending = [name, value]
        while pending:
            found = pending.pop()
            if isinstance(found, dict):
                pending += [*found.keys(), *found.values()]
            elif isinstance(found, list):
                pending += found
            elif isinstance(found, str) and (problem := text_problem(found)):
                problems[field] = problem
                break
    return problems


def text(
    data: dict,
    name: str,
    problems: dict[str, str],
    *,
    max_length: int,
    required: bool = False,
    blank: bool = False,
) -> str | None:
    """A text field, or None when it is absent or null (a problem if it is `required`)."""
    value = data.get(name)
    if value is None:
        if required:
            problems[name] = "required"
        return None
    if not isinstance(value, str):
        problems[name] = "must be text"
    elif not blank and not value.strip():
        problems[name] = "must not be blank"
    elif len(value) > max_length:
        problems[name] = f"at most {max_length} characters"
    else:
        return value
    return None


def page_of(
    request: HttpRequest,
    rows: QuerySet,
    per_page: int,
    render: Callable[[list], list],
    *,
    order: list[str],
    count: int | Callable[[], int],
) -> dict:
    """One page of a list: `{results, count, next, previous}` with absolute links. `page` is a page
    number near the start of the list, `last`, or the cursor a `next` or `previous` link carries
    (review/paging.py); anything else is a 400."""
    try:
        page = keyset_page(rows, order=order, per_page=per_page, page=request.GET.get("page"), count=count)
    except PageRefused as refusal:
        raise invalid({"page": str(refusal)}) from None
    if not page.object_list and (page.number or 1) > 1:
        raise ApiError(404, "not_found", f"There is no page {page.number}")

    def link(to: str) -> str:
        query = request.GET.copy()
        query["page"] = to
        return request.build_absolute_uri(f"{request.path}?{query.urlencode()}")

    return {
        "results": render(page.object_list),
        "count": page.count,
        "next": link(page.next_page) if page.has_next else None,
        "previous": link(page.previous_page) if page.has_previous else None,
    }


# --- how things are shown ------------------------------------------------------------------


def submission_json(submission: Submission) -> dict:
    return {
        "id": submission.pk,
        "provider": submission.provider,
        "model": submission.model,
        "provider_ref": submission.provider_ref,
        "state": submission.state,
        "label": SubmissionState(submission.state).label,
        "last_observed_at": submission.last_observed_at,
        "last_observed_status": submission.last_observed_status,
        "request_counts": submission.request_counts,
        "anomalies": submission.anomalies,
        "error": submission.error,
        "refusing_since": submission.refusing_since,
        "gives_up_at": submission.gives_up_at,
        "slowed_until": submission.slowed_until,
        "created_at": submission.created_at,
        # SPEC §11: the date by which the provider's results must be collected (null: none known).
        "ended_at": submission.ended_at,
        "collect_by": submission.collect_by,
        "collection_at_risk": submission.collection_at_risk,
        "provider_files_deleted_at": submission.files_deleted_at,
    }


def jobs_json(request: HttpRequest, jobs: list[Job]) -> list[dict]:
    """Jobs with their counts, first submissions and cost: a fixed number of queries, and one for each
    job's first SUBMISSIONS_SHOWN submissions."""
    ids = [job.pk for job in jobs]
    counts = ItemTally.objects.counts_by_job(ids)
    submission_counts = dict(
        Submission.objects.filter(job_id__in=ids).order_by().values_list("job_id").annotate(n=Count("id"))
    )
    submissions: dict[int, list[dict]] = {
        job.pk: [submission_json(s) for s in job.submissions.order_by("id")[:SUBMISSIONS_SHOWN]]
        if submission_counts.get(job.pk)
        else []
        for job in jobs
    }
    costs = pricing.jobs_cost(ids)
    spent_or_held = budgets.committed_by_job([job.pk for job in jobs if job.budget is not None])
    pilots = {pilot.job_id: pilot for pilot in Pilot.objects.filter(job_id__in=ids)}
    return [
        {
            "id": job.pk,
            "reference": job.reference,
            "state": job.state,
            "label": JobState(job.state).label,
            "owner": job.owner.get_username(),
            "task": job.task,
            "prompt_version": job.prompt_version.version,
            "provider": job.provider,
            "model": job.model,
            "destination": job.destination,
            "unit_size": job.unit_size,
            "created_at": job.created_at,
            "updated_at": job.updated_at,
            "url": request.build_absolute_uri(reverse("api:job", args=[job.pk])),
            "items_url": request.build_absolute_uri(reverse("api:job_items", args=[job.pk])),
            "item_count": sum(counts[job.pk].values()),
            "counts": {state: counts[job.pk].get(state, 0) for state in ItemState.values},
            "needs_attention": needs_attention(counts[job.pk]),
            "submissions": submissions[job.pk],
            "submission_count": submission_counts.get(job.pk, 0),
            "submissions_url": request.build_absolute_uri(reverse("api:job_submissions", args=[job.pk])),
            "cost": costs[job.pk],
            "budget": budget_json(job, spent_or_held.get(job.pk)),
            "pause": {"reason": job.pause_reason, "detail": job.pause_detail}
            if job.state == JobState.PAUSED
            else None,
            "pilot": pilot_json(request, pilots.get(job.pk)),
            "notify_url": shown_notify_url(request.user, job) or None,
            "notifications_url": request.build_absolute_uri(reverse("api:job_notifications", args=[job.pk])),
            "stream_url": request.build_absolute_uri(reverse("api:job_stream", args=[job.pk])),
        }
        for job in jobs
    ]


def budget_json(job: Job, held) -> dict | None:
    """The job's budget and what it has spent or holds against it (rule 18), or None without one."""
    if job.budget is None:
        return None
    held = held or Decimal(0)
    return {
        "amount": job.budget,
        "currency": job.budget_currency,
        "spent_or_held": held.quantize(Decimal("0.01"), rounding=ROUND_CEILING),
        "left": max(job.budget - held, Decimal(0)).quantize(Decimal("0.01"), rounding=ROUND_FLOOR),
    }


def pilot_json(request: HttpRequest, pilot: Pilot | None) -> dict | None:
    """A pilot's settings and where its report is; None for a job that is no pilot."""
    if pilot is None:
        return None
    return {
        "per_stratum": pilot.per_stratum,
        "strata": pilot.strata,
        "seed": pilot.seed,
        "drill": pilot.drill,
        "report_url": request.build_absolute_uri(reverse("api:pilot_report", args=[pilot.job_id])),
    }


def item_json(request: HttpRequest, item: Item) -> dict:
    return {
        "id": item.pk,
        "job": item.job_id,
        "sku": item.product.sku,
        "source_revision": item.source_revision.number,
        "state": item.state,
        "label": item.label,
        "reason": item.reason,
        "custom_id": item.custom_id,
        "updated_at": item.updated_at,
        "url": request.build_absolute_uri(reverse("api:item", args=[item.pk])),
    }


def product_json(product: Product) -> dict:
    revision = product.current_revision
    published = None
    if product.published_at is not None:
        version = product.published_version
        published = {
            "content": product.published_content,
            "generated_version": version.number if version else None,
            "generated_version_id": product.published_version_id,
            "revision": product.published_revision,
            "at": product.published_at,
        }
    return {
        "sku": product.sku,
        "title": revision.title if revision else "",
        "status": product.status,
        "revision": revision.number if revision else None,
        "fields": revision.fields if revision else {},
        "published": published,
    }


def products() -> QuerySet[Product]:
    return Product.objects.select_related("current_revision", "published_version")


def items() -> QuerySet[Item]:
    return Item.objects.select_related("product", "source_revision")


# --- jobs ----------------------------------------------------------------------------------

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


@endpoint(GET=VIEWERS, POST=APPROVERS)
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


def job_created_json(request: HttpRequest, job: Job) -> dict:
    return {
        "id": job.pk,
        "reference": job.reference,
        "state": job.state,
        "url": request.build_absolute_uri(reverse("api:job", args=[job.pk])),
    }


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


@endpoint(GET=VIEWERS)
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    found = Job.objects.select_related("owner", "prompt_version").filter(pk=job_id).first()
    if found is None:
        return not_found(request, "No job")
    return JsonResponse(jobs_json(request, [found])[0])


@endpoint(POST=(OPERATOR, *APPROVERS))
def cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    read_json(request, allowed=())
    found = Job.objects.filter(pk=job_id).first()
    if found is None:
        return not_found(request, "No job")
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


@endpoint(POST=APPROVERS)
def budget(request: HttpRequest, job_id: int) -> HttpResponse:
    """`{budget}` in the business currency: sets or raises the job's budget; a job paused by its
    budget goes on."""
    data = read_json(request, allowed=("budget",))
    found = Job.objects.filter(pk=job_id).first()
    if found is None:
        return not_found(request, "No job")
    if not may_spend(request.user, found):
        raise ApiError(
            403, "forbidden", "Only the person who started the job, or an admin, may change its budget"
        )
    value = data.get("budget")
    amount = read_amount(value)
    if amount is None:
        raise invalid({"budget": 'must be an amount above 0 such as "12.50"'})
    try:
        job = set_budget(found.pk, amount, actor=request.user)
    except NotAllowed as exc:
        raise ApiError(409, "not_allowed", str(exc), {"budget": str(exc)}) from None
    job = Job.objects.select_related("owner", "prompt_version").get(pk=job.pk)
    return JsonResponse(jobs_json(request, [job])[0])


@endpoint(POST=APPROVERS)
def resume(request: HttpRequest, job_id: int) -> HttpResponse:
    """A paused job goes on (after a billing refusal, once the account can pay again)."""
    read_json(request, allowed=())
    found = Job.objects.filter(pk=job_id).first()
    if found is None:
        return not_found(request, "No job")
    if not may_spend(request.user, found):
        raise ApiError(403, "forbidden", "Only the person who started the job, or an admin, may resume it")
    try:
        resume_job(found.pk, actor=request.user)
    except NotAllowed as exc:
        raise ApiError(409, "not_allowed", str(exc)) from None
    job = Job.objects.select_related("owner", "prompt_version").get(pk=found.pk)
    return JsonResponse(jobs_json(request, [job])[0])


def read_amount(value) -> Decimal | None:
    """An amount of money above 0 with at most two decimals, from JSON text or a number."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        return None
    if (
        not amount.is_finite()
        or amount <= 0
        or amount >= Decimal("1e12")
        or amount != amount.quantize(Decimal("0.01"))
    ):
        return None
    return amount


@endpoint(GET=VIEWERS)
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


@endpoint(GET=VIEWERS)
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


# --- items ---------------------------------------------------------------------------------


def version_cost_json(version: GeneratedVersion, price: pricing.Price | None) -> dict:
    """What the version cost in the business currency, at the rate of the day it arrived (`currency`
    says which; USD when no rate was in force), with the provider's amount beside it."""
    if price is None:
        return {"cost": None, "currency": None, "provider_cost": None, "provider_currency": PROVIDER_CURRENCY}
    usd = price.cost(version.input_tokens, version.output_tokens).quantize(pricing.PLACES)
    shown = in_business_currency(usd, on=timezone.localdate(version.created_at))
    return {
        "cost": shown.amount,
        "currency": shown.currency,
        "provider_cost": usd,
        "provider_currency": PROVIDER_CURRENCY,
    }


def version_json(version: GeneratedVersion, price: pricing.Price | None, price_note: str) -> dict:
    """`usage.apportioned`: the tokens are this version's share of a batch-wide total (the provider
    gave usage only per batch), and so is its `cost`. `cost` is null when the model has no known price."""
    return {
        "id": version.pk,
        "number": version.number,
        # Null once the retention pass erased an unusable draft's text (SPEC §11); its hash stays.
        "content": None if version.content_expired_at else version.content,
        "content_hash": version.content_hash,
        "content_expired_at": version.content_expired_at,
        "content_length": version.length,
        "validation": {
            "valid": version.valid,
            "reasons": version.validation_reasons,
            "notes": version.validation_notes,
        },
        "usage": {
            "input_tokens": version.input_tokens,
            "output_tokens": version.output_tokens,
            "apportioned": pricing.is_apportioned(version),
        },
        **version_cost_json(version, price),
        "price_known": price is not None,
        "price_note": price_note,
        "created_at": version.created_at,
    }


def item_detail_json(request: HttpRequest, item: Item) -> dict:
    job = item.job
    price = pricing.price_for(job.provider, job.model)
    note = price.note if price is not None else pricing.unknown_price(job.provider, job.model)
    return {
        **item_json(request, item),
        "current_revision": item.product.current_revision.number if item.product.current_revision else None,
        "approved_version": item.approved_version_id,
        "versions": [version_json(v, price, note) for v in item.versions.order_by("number")],
        "approvals": [
            {
                "id": approval.pk,
                "version": approval.version_id,
                "version_hash": approval.version_hash,
                "approved_by": approval.approved_by.get_username(),
                "approved_at": approval.approved_at,
                "final_content": approval.final_content,
                "edited": approval.edited,
                "note": approval.note,
            }
            for approval in item.approvals.select_related("approved_by").order_by("approved_at", "id")
        ],
        "destination_attempts": [
            {
                "id": attempt.pk,
                "version": attempt.version_id,
                "destination": attempt.destination,
                "operation_key": attempt.operation_key,
                "outcome": attempt.outcome,
                "response": attempt.response,
                "started_at": attempt.started_at,
                "finished_at": attempt.finished_at,
            }
            for attempt in item.destination_attempts.order_by("started_at", "id")
        ],
        "events": [
            {
                "at": event.at,
                "from": event.from_state,
                "to": event.to_state,
                "actor": event.actor_name,
                "reason": event.reason,
                "data": event.data,
            }
            for event in item.events.order_by("id")
        ],
    }


def item_or_404(item_id: int) -> Item:
    found = items().select_related("job", "product__current_revision").filter(pk=item_id).first()
    if found is None:
        raise ApiError(404, "not_found", f"No item {item_id}")
    return found


def version_or_404(item_id: int, version_id: int) -> GeneratedVersion:
    item_or_404(item_id)
    version = GeneratedVersion.objects.filter(pk=version_id, item_id=item_id).first()
    if version is None:
        raise ApiError(404, "not_found", f"Item {item_id} has no version {version_id}")
    return version


@endpoint(GET=VIEWERS)
def item_detail(request: HttpRequest, item_id: int) -> HttpResponse:
    return JsonResponse(item_detail_json(request, item_or_404(item_id)))


@endpoint(POST=APPROVERS)
def approve(request: HttpRequest, item_id: int, version_id: int) -> HttpResponse:
    data = read_json(request, allowed=("content", "note"))
    problems: dict[str, str] = {}
    content = text(data, "content", problems, max_length=MAX_CONTENT_LENGTH, blank=True)
    note = text(data, "note", problems, max_length=MAX_NOTE_LENGTH, blank=True) or ""
    if problems:
        raise invalid(problems)
    version = version_or_404(item_id, version_id)
    # There is no screen here that showed a hash: the caller approves the version as it is stored.
    try:
        approval = approve_version(
            item_id=item_id,
            version_id=version.pk,
            version_hash=version.content_hash,
            approver=request.user,
            content=content,
            note=note,
        )
    except EditRefused as refusal:  # the edited text is bad input: 400 with its reasons (rule 15)
        raise ApiError(400, "invalid", str(refusal), {"content": "; ".join(refusal.reasons)}) from None
    body = item_json(request, item_or_404(item_id))
    body["approval"] = {"id": approval.pk, "version": version.pk, "edited": approval.edited}
    return JsonResponse(body)


@endpoint(POST=APPROVERS)
def reject(request: HttpRequest, item_id: int, version_id: int) -> HttpResponse:
    data = read_json(request, allowed=("reason",))
    problems: dict[str, str] = {}
    reason = text(data, "reason", problems, required=True, max_length=MAX_NOTE_LENGTH)
    if problems:
        raise invalid(problems)
    version = version_or_404(item_id, version_id)
    reject_version(item_id=item_id, version_id=version.pk, reviewer=request.user, reason=reason)
    return JsonResponse(item_json(request, item_or_404(item_id)))


RETRY_UNITS = ("inference", "destination")


@endpoint(POST=OPERATORS)
def retry(request: HttpRequest, item_id: int) -> HttpResponse:
    data = read_json(request, allowed=("unit",))
    if data.get("unit") not in RETRY_UNITS:
        raise invalid({"unit": "required: inference or destination"})
    item_or_404(item_id)
    retry_item(item_id, unit=data["unit"], actor=request.user)
    return JsonResponse(item_json(request, item_or_404(item_id)))


# --- products ------------------------------------------------------------------------------


@endpoint(GET=VIEWERS, PUT=APPROVERS)
def product_detail(request: HttpRequest, sku: str) -> HttpResponse:
    if request.method == "PUT":
        return put_product(request, sku)
    found = products().filter(sku=sku).first() if SKU_PATTERN.fullmatch(sku) else None
    if found is None:
        return not_found(request, "No product")
    return JsonResponse(product_json(found))


def importer_check(check: Callable[[Any, list[str]], Any], value: Any) -> tuple[Any, str]:
    """One of the catalogue importer's checks: what it returns, and its complaints ("" if none)."""
    complaints: list[str] = []
    result = check(value, complaints)
    return result, "; ".join(complaints)


def product_content(sku: str, data: dict, existing: Product | None) -> tuple[str, dict]:
    """`{title, ...fields}` checked as the importer checks a catalogue record (SPEC §7). `sku`
    and `status` are not content: they may be sent, as long as they say what is already so."""
    problems: dict[str, str] = {}
    _, problems["sku"] = importer_check(check_sku, sku)
    values, problems["body"] = importer_check(normalise_keys, data)
    if values.pop("sku", sku) != sku:
        problems["sku"] = "differs from the SKU in the address"
    if values.pop("status", None) not in (None, existing.status if existing else ProductStatus.ACTIVE):
        problems["status"] = "not content: withdraw a product with POST /api/products/{sku}/withdraw"
    title, problems["title"] = importer_check(check_title, values.pop("title", None))
    fields = {}
    for name, value in values.items():
        checked, problems[name] = importer_check(check_fields, {name: value})
        fields.update(checked)
    problems = {name: problem for name, problem in problems.items() if problem}
    if problems:
        raise invalid(problems)
    return title, fields


def put_product(request: HttpRequest, sku: str) -> HttpResponse:
    data = read_json(request)
    if len(request.body) > MAX_RECORD_BYTES:
        raise ApiError(400, "too_large", f"A product record is at most {MAX_RECORD_BYTES} bytes")
    existing = Product.objects.filter(sku=sku).first() if SKU_PATTERN.fullmatch(sku) else None
    title, fields = product_content(sku, data, existing)
    change = revise_product(sku=sku, title=title, fields=fields, actor=request.user)
    return JsonResponse(product_json(products().get(sku=sku)), status=201 if change.created else 200)


@endpoint(POST=APPROVERS)
def withdraw(request: HttpRequest, sku: str) -> HttpResponse:
    read_json(request, allowed=())
    if not SKU_PATTERN.fullmatch(sku) or not Product.objects.filter(sku=sku).exists():
        return not_found(request, "No product")
    withdraw_product(sku=sku, actor=request.user)
    return JsonResponse(product_json(products().get(sku=sku)))


# --- prompts -------------------------------------------------------------------------------

# A prompt version number is a PostgreSQL integer.
MAX_PROMPT_VERSION = 2**31 - 1


def current_prompt_json(task: str) -> dict:
    """The task's current version and the choice that made it so (all null when none is current)."""
    choice = (
        CurrentPromptChoice.objects.filter(task=task)
        .select_related("prompt_version", "replaced")
        .order_by("-pk")
        .first()
    )
    return {
        "task": task,
        "version": choice.prompt_version.version if choice else None,
        "prompt_version_id": choice.prompt_version_id if choice else None,
        "made_current_by": choice.actor_name if choice else None,
        "made_current_at": choice.made_at if choice else None,
        "replaced_version": choice.replaced.version if choice and choice.replaced else None,
    }


@endpoint(GET=VIEWERS, POST=APPROVERS)
def prompt_current(request: HttpRequest, task: str) -> HttpResponse:
    """GET: the task's current prompt version. POST `{version}`: make that version current (SPEC §6),
    recorded with who and when; `changed` is false when it was current already."""
    if not re.fullmatch(PROMPT_TASK_PATTERN, task) or not PromptVersion.objects.filter(task=task).exists():
        return not_found(request, "No prompt task")
    if request.method == "GET":
        return JsonResponse(current_prompt_json(task))
    data = read_json(request, allowed=("version",))
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_PROMPT_VERSION:
        raise invalid({"version": "required: the version number within the task, a whole number from 1"})
    prompt = PromptVersion.objects.filter(task=task, version=version).first()
    if prompt is None:
        raise invalid({"version": f"the task {task} has no version {version}"})
    _, changed = make_prompt_current(prompt=prompt, actor=request.user)
    return JsonResponse({**current_prompt_json(task), "changed": changed})


# --- health and metrics --------------------------------------------------------------------


@csrf_exempt
def health(request: HttpRequest) -> HttpResponse:
    """Open to anyone: whether the parts are up, and how much work is queued; nothing else.
    503 when the database or the broker cannot be reached; a stalled collector is reported, not
    failed, since restarting a web process would not help it."""
    if request.method != "GET":
        response = ApiError(405, "method_not_allowed", f"{request.method} is not allowed here").response()
        response["Allow"] = "GET"
        return response
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        database = "ok"
    except DatabaseError:
        database = "unavailable"
    broker = {"kind": "redis" if settings.REDIS_URL else "database", "reachable": False}
    queue_depth = None
    try:
        queue = get_broker()
        broker["reachable"] = bool(queue.ping())
        queue_depth = queue.queue_size()
    except Exception:  # an unreachable broker is what this endpoint is there to report
        log.warning("The task broker cannot be reached", exc_info=True)
    collector = {"last_poll_at": None, "stalled": None, "units_failing_to_record": None}
    if database == "ok":
        collector = {
            "last_poll_at": last_poll_at(),
            "stalled": collector_stalled(),
            "units_failing_to_record": units_failing_to_record(),
        }
    body = {"database": database, "broker": broker, "collector": collector, "queue_depth": queue_depth}
    # Ended units not collected past half the time their provider keeps their results (SPEC §11).
    body["collection_at_risk"] = collection_at_risk() if database == "ok" else None
    healthy = database == "ok" and broker["reachable"]
    return JsonResponse(body, status=200 if healthy else 503)


# Submissions that have not finished: still to be sent, being reconciled, at the provider, or
# waiting to be collected.
UNFINISHED_SUBMISSION_STATES = (
    SubmissionState.INTENT,
    SubmissionState.UNCERTAIN,
    SubmissionState.OPEN,
    SubmissionState.ENDED,
)
DESTINATION_FAILURES = (AttemptOutcome.RETRYABLE, AttemptOutcome.REJECTED, AttemptOutcome.REFUSED_BY_GUARD)


def label_value(text: str) -> str:
    """A Prometheus label value: backslash, double quote and line feed escaped."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metric(lines: list[str], name: str, kind: str, help_text: str, samples: dict[str, object]) -> None:
    lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{labels} {value}" for labels, value in samples.items()]


def failures_by_provider() -> dict[tuple[str, str], int]:
    """Failed inferences and failed destination attempts by (kind, provider of their job), every
    configured provider's series present from the start. Two grouped counts over the few rows of
    their partial indexes."""
    inference = (
        Event.objects.filter(to_state=ItemState.INFERENCE_FAILED)
        .order_by()
        .values_list("job__provider")
        .annotate(n=Count("pk"))
    )
    destination = (
        DestinationAttempt.objects.filter(outcome__in=DESTINATION_FAILURES)
        .order_by()
        .values_list("item__job__provider")
        .annotate(n=Count("pk"))
    )
    kinds = {"inference": inference, "destination": destination}
    counts = {(kind, provider): 0 for kind in kinds for provider in configured_provider_names()}
    for kind, rows in kinds.items():
        for provider, n in rows:
            key = (kind, provider or "unknown")  # an event that names no job
            counts[key] = counts.get(key, 0) + n
    return dict(sorted(counts.items()))


@endpoint(GET=VIEWERS)
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text exposition. Scrape it with a bearer token, like the API."""
    now = timezone.now()
    items_by_state = ItemTally.objects.counts_by_state()
    unfinished = Submission.objects.filter(state__in=UNFINISHED_SUBMISSION_STATES).aggregate(
        n=Count("pk"), oldest=Min("created_at")
    )
    oldest_age = (now - unfinished["oldest"]).total_seconds() if unfinished["oldest"] else 0
    failures = failures_by_provider()
    polled = last_poll_at()
    lines: list[str] = []
    metric(
        lines,
        "batchdesk_items",
        "gauge",
        "Items in each state.",
        {f'{{state="{state}"}}': items_by_state.get(state, 0) for state in ItemState.values},
    )
    metric(
        lines,
        "batchdesk_open_submissions",
        "gauge",
        "Submissions not yet collected: intent, uncertain, open or ended.",
        {"": unfinished["n"]},
    )
    metric(
        lines,
        "batchdesk_oldest_open_submission_age_seconds",
        "gauge",
        "Age of the oldest submission not yet collected; 0 when there is none.",
        {"": f"{oldest_age:.3f}"},
    )
    metric(
        lines,
        "batchdesk_failures_total",
        "counter",
        "Failed inferences (results with no usable answer, retried or not) and failed destination "
        "attempts, by the provider of their job.",
        {
            f'{{kind="{kind}",provider="{label_value(provider)}"}}': count
            for (kind, provider), count in failures.items()
        },
    )
    metric(
        lines,
        "batchdesk_items_needing_attention",
        "gauge",
        "Items waiting for an operator (as on the operations page), by the provider of their job and state.",
        {
            f'{{provider="{label_value(provider)}",state="{state}"}}': count
            for (provider, state), count in attention_by_provider(with_zeros=True).items()
        },
    )
    spend = pricing.spend()
    metric(
        lines,
        "batchdesk_spend_total",
        "counter",
        "USD spent on drafts whose model has a known price.",
        {"": spend.total},
    )
    metric(
        lines,
        "batchdesk_spend_business_total",
        "counter",
        "What finished provider batches cost, in the currency each was kept in (the business currency "
        "of the day, at the rate then in force; USD where no rate was).",
        {
            f'{{currency="{label_value(currency)}"}}': amount
            for currency, amount in budgets.spent_by_currency().items()
        },
    )
    metric(
        lines,
        "batchdesk_unpriced_tokens_total",
        "counter",
        "Tokens used by models without a known price (not in batchdesk_spend_total).",
        {
            f'{{provider="{label_value(provider)}",model="{label_value(model)}"}}': tokens
            for (provider, model), tokens in sorted(spend.unpriced_tokens.items())
        },
    )
    metric(
        lines,
        "batchdesk_collector_stalled",
        "gauge",
        "1 when work waits on a collector that has not polled within 3 poll intervals.",
        {"": int(collector_stalled())},
    )
    metric(
        lines,
        "batchdesk_units_failing_to_record",
        "gauge",
        "Units whose results failed to be recorded several collections in a row.",
        {"": units_failing_to_record()},
    )
    at_risk = collection_at_risk()
    metric(
        lines,
        "batchdesk_units_collection_at_risk",
        "gauge",
        "Ended units not collected yet past half the time their provider keeps their results.",
        {"": at_risk["units"]},
    )
    metric(
        lines,
        "batchdesk_earliest_collect_by_timestamp_seconds",
        "gauge",
        "The earliest collect-by date of a unit at risk, in Unix seconds; 0 when none is at risk.",
        {"": f"{at_risk['earliest_collect_by'].timestamp():.3f}" if at_risk["earliest_collect_by"] else 0},
    )
    told = undelivered()
    metric(
        lines,
        "batchdesk_notifications_retrying",
        "gauge",
        "Job notifications whose delivery failed and is being tried again (for 24 hours).",
        {"": told["retrying"]},
    )
    metric(
        lines,
        "batchdesk_notifications_given_up",
        "gauge",
        "Job notifications given up after 24 hours of failed deliveries.",
        {"": told["given_up"]},
    )
    metric(
        lines,
        "batchdesk_collector_last_poll_timestamp_seconds",
        "gauge",
        "When the collector last polled, in Unix seconds; 0 if it never has.",
        {"": f"{polled.timestamp():.3f}" if polled else 0},
    )
    return HttpResponse("\n".join(lines) + "\n", content_type="text/plain; version=0.0.4; charset=utf-8")


def server_error(request: HttpRequest) -> HttpResponse:
    """Django's handler500: a fault outside an API view (in a middleware, say) still answers the
    API's callers in JSON. Django has logged it already."""
    if request.path_info.startswith("/api/"):
        return server_error_response()
    return defaults.server_error(request)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    """Django's handler400, for a request Django itself refuses before any view reads it (more form
    fields than DATA_UPLOAD_MAX_NUMBER_FIELDS, a form body over DATA_UPLOAD_MAX_MEMORY_SIZE, a Host
    not in ALLOWED_HOSTS): JSON under /api/, the application's page (400.html) elsewhere."""
    if request.path_info.startswith("/api/"):
        return ApiError(400, "bad_request", "The request could not be read; nothing was changed.").response()
    return defaults.bad_request(request, exception)


@csrf_exempt
def unknown(request: HttpRequest, *args, **kwargs) -> HttpResponse:
    """Any other address under /api/: a JSON 404 rather than an HTML page."""
    return not_found(request)
