"""The JSON of each resource (SPEC §6): jobs with their submissions, budget and pilot; items with their
versions, approvals, destination attempts and events; products; a task's current prompt; a job's
notifications; and one page of a list. Times and amounts are written by Django's JSON encoder."""

from collections.abc import Callable

from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone

from ledger.actions.budgeting import next_request_need
from ledger.models import (
    Comment,
    CurrentPromptChoice,
    GeneratedVersion,
    Item,
    ItemTally,
    Job,
    JobNotification,
    PauseReason,
    Pilot,
    Product,
    Submission,
)
from ledger.money import budgets, pricing
from ledger.money.currency import PROVIDER_CURRENCY, in_business_currency
from ledger.states import ItemState, JobState, SubmissionState, waiting_for_operator

from ..job_notifications import NotificationRow
from ..paging import PageRefused, keyset_page
from ..recipients import shown_notify_url
from .errors import ApiError, invalid

# A job shows its first submissions (by id) inline; `submissions_url` pages through all of them
# (a million items in units of 500, a size a job may ask for, are 2,000 submissions).
SUBMISSIONS_SHOWN = 100


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


# --- jobs ----------------------------------------------------------------------------------


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
    """Jobs with their counts, first submissions, cost and budget: a fixed number of queries, and one
    for each job's first SUBMISSIONS_SHOWN submissions (and for what a job its budget paused waits for)."""
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
    # What a job its budget paused waits for is told with its next request's need as it stands now:
    # like its first submissions, a query for each such job that has a unit.
    paused_by_budget = [
        job
        for job in jobs
        if job.state == JobState.PAUSED
        and job.pause_reason == PauseReason.BUDGET_REACHED
        and submission_counts.get(job.pk)
    ]
    standing = budgets.figures_by_job(
        jobs, next_needs={job.pk: next_request_need(job) for job in paused_by_budget}
    )
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
            "needs_attention": waiting_for_operator(counts[job.pk]),
            "submissions": submissions[job.pk],
            "submission_count": submission_counts.get(job.pk, 0),
            "submissions_url": request.build_absolute_uri(reverse("api:job_submissions", args=[job.pk])),
            "cost": costs[job.pk],
            "budget": budget_json(standing.get(job.pk)),
            "pause": pause_json(job, standing.get(job.pk)),
            "pilot": pilot_json(request, pilots.get(job.pk)),
            "notify_url": shown_notify_url(request.user, job) or None,
            "notifications_url": request.build_absolute_uri(reverse("api:job_notifications", args=[job.pk])),
            "stream_url": request.build_absolute_uri(reverse("api:job_stream", args=[job.pk])),
        }
        for job in jobs
    ]


def budget_json(figures: budgets.BudgetFigures | None) -> dict | None:
    """The job's budget and what it has spent, holds and has left now (rule 18), as exact decimals;
    None without one."""
    if figures is None:
        return None
    return {
        "amount": figures.budget,
        "currency": figures.currency,
        "spent": figures.spent,
        "held": figures.held,
        "units_in_flight": figures.in_flight,
        "spent_or_held": figures.spent_or_held,
        "left": figures.left,
    }


def pause_json(job: Job, figures: budgets.BudgetFigures | None) -> dict | None:
    """Why the job is paused: for its budget, what it waits for with the figures of now (the words
    of the moment it paused stay on its event)."""
    if job.state != JobState.PAUSED:
        return None
    if job.pause_reason == PauseReason.BUDGET_REACHED and figures is not None:
        return {"reason": job.pause_reason, "detail": figures.waiting_for()}
    return {"reason": job.pause_reason, "detail": job.pause_detail}


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


def job_created_json(request: HttpRequest, job: Job) -> dict:
    return {
        "id": job.pk,
        "reference": job.reference,
        "state": job.state,
        "url": request.build_absolute_uri(reverse("api:job", args=[job.pk])),
    }


# --- items ---------------------------------------------------------------------------------


def items() -> QuerySet[Item]:
    return Item.objects.select_related("product", "source_revision")


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
                "undone_at": approval.undone_at,
            }
            for approval in item.approvals.select_related("approved_by").order_by("approved_at", "id")
        ],
        "comments": [comment_json(c) for c in item.comments.select_related("author")],
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


def comment_json(comment: Comment) -> dict:
    return {
        "id": comment.pk,
        "version": comment.version_id,
        "by": comment.author.get_username(),
        "at": comment.at,
        "text": comment.text,
    }


# --- products and prompts ------------------------------------------------------------------


def products() -> QuerySet[Product]:
    return Product.objects.select_related("current_revision", "published_version")


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


# --- notifications -------------------------------------------------------------------------


def notification_json(notification: JobNotification, *, to: str, answers: bool) -> dict:
    """A notification told (`to`: where it went, as the caller may read it) and each attempt; the
    receiver's answer only when `answers` (its job's owner and admins: review/recipients.py), else null."""
    row = NotificationRow(notification, list(notification.tries.all()))
    return {
        "id": notification.pk,
        "webhook_id": notification.message_id,
        "type": notification.event_type,
        "channel": notification.channel,
        "to": to,
        "created_at": notification.created_at,
        "outcome": row.outcome_code,
        "delivered_at": notification.delivered_at,
        "gave_up_at": notification.gave_up_at,
        "next_attempt_at": notification.next_attempt_at if notification.attempts else None,
        "attempts": [
            {
                "at": attempt.at,
                "status": attempt.status,
                "error": attempt.error,
                "answer": attempt.answer if answers else None,
            }
            for attempt in row.tries
        ],
    }
