"""Jobs: the dashboard, the list of jobs, starting one (with its estimated cost) and one job's page."""

import json
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import partial
from itertools import chain
from uuid import UUID

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import IntegrityError, transaction
from django.db.models import Count, QuerySet, Sum
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseStopPolling

from ledger.actions import CANCELLABLE_ITEM_STATES, NotAllowed, cancel_job, create_job, resume_job, set_budget
from ledger.actions.budgeting import next_request_need
from ledger.database.setwise import among
from ledger.database.table_statistics import analyse_after_bulk_change
from ledger.models import DraftTally, Event, GeneratedVersion, Item, ItemTally, Job, PauseReason, Submission
from ledger.money import budgets
from ledger.money.budgets import BudgetFigures
from ledger.money.currency import business_currency, in_business_currency
from ledger.money.estimates import RequestEstimate, request_estimate
from ledger.money.pricing import PLACES, DraftSpend, Price, job_cost, price_for, priced_spend, unknown_price
from ledger.providers import answers_at_once, capabilities
from ledger.states import ItemState, JobState, SubmissionState, waiting_for_operator

from .common import WORKING_JOB_STATES, HtmxHttpRequest, progress_of, state_counts, url_of, wants_partial
from .display import money_text
from .forms import BudgetField, ItemFilterForm
from .item_lists import Column, FieldFilterForm, sorting, with_field
from .job_forms import StartTokenForm
from .job_notifications import job_notifications
from .models import JobStartToken
from .paging import COUNT_CAP, capped_count, screen_page
from .permissions import (
    ADMIN,
    APPROVERS,
    OPERATOR,
    VIEWERS,
    has_role,
    may_cancel,
    may_see_recipients,
    may_spend,
    role_required,
)
from .receipts import job_receipts
from .recipients import shown_notify_url
from .screen_forms import JobFilterForm, JobStartForm
from .search import products_with_sku

JOBS_PER_PAGE = 25
ITEMS_PER_PAGE = 50
# A job of a million items has 200 submissions at the default 5,000 a unit, 1,000 at Cloudflare's
# limit and more when it asks for smaller units: the page shows them a page at a time.
SUBMISSIONS_PER_PAGE = 10
# A SKU filter looks for the job's items of at most this many products whose SKU contains it.
SKU_PRODUCTS_CAP = 200


def polled(response: HttpResponse, polling: bool) -> HttpResponse:
    """An htmx poll's answer; once nothing on it moves any more, it also tells htmx to stop polling."""
    return response if polling else HttpResponseStopPolling(response.content)


def render_jobs(request: HtmxHttpRequest, template: str, jobs: QuerySet[Job], **extra) -> HttpResponse:
    """A page of jobs with their progress; an htmx poll gets only the `jobs` partial, and is told to
    stop once no job on the page is still moving."""
    page = Paginator(jobs, JOBS_PER_PAGE).get_page(request.GET.get("page"))
    rows = list(page.object_list)
    polling = any(job.state in WORKING_JOB_STATES for job in rows)
    context = {"page": page, "progress": progress_of(rows), "polling": polling, **extra}
    if wants_partial(request):
        return polled(render(request, f"{template}#jobs", context), polling)
    return render(request, template, context)


@dataclass(frozen=True)
class Waiting:
    """What waits for the person looking, by their role: drafts to review (catalogue owners), items
    waiting for an operator (operators), both for admins; and what the day's drafts cost so far."""

    drafts_to_review: int | None
    items_for_operator: int | None
    spend_today: DraftSpend
    # Paused jobs the person may let go on (their own; every one for admins), oldest first.
    paused_jobs: list[Job]


def start_of_today() -> datetime:
    """Midnight in the viewer's time zone."""
    return timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)


def spend_since(moment: datetime) -> DraftSpend:
    """What the drafts received since `moment` cost, priced by the rule `pricing.draft_spend` prices every
    draft by (`priced_spend`): by their job's provider and model. They are counted by the draft
    tallies of the quarter hours from `moment` on (a few rows, however many drafts arrived) and,
    when `moment` falls inside a quarter hour, read themselves until the next one begins (found
    through their BRIN index by the time)."""
    period = DraftTally.period_from(moment)
    tokens = {"input_tokens": Sum("input_tokens"), "output_tokens": Sum("output_tokens")}
    counted = [
        DraftTally.objects.filter(received__gte=period)
        .order_by()
        .values_list("job__provider", "job__model")
        .annotate(drafts=Sum("drafts"), **tokens)
    ]
    if period > moment:
        counted.append(
            GeneratedVersion.objects.filter(created_at__gte=moment, created_at__lt=period)
            .order_by()
            .values_list("item__job__provider", "item__job__model")
            .annotate(drafts=Count("pk"), **tokens)
        )
    spent: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for provider, model, drafts, input_tokens, output_tokens in chain.from_iterable(counted):
        spent[(provider, model)].update(drafts=drafts, input=input_tokens, output=output_tokens)
    return priced_spend(
        (provider, model, sums["input"], sums["output"])
        for (provider, model), sums in spent.items()
        if sums["drafts"]
    )


def waiting_for(user) -> Waiting:
    counts = ItemTally.objects.counts_by_state()
    return Waiting(
        drafts_to_review=counts.get(ItemState.AWAITING_REVIEW, 0) if has_role(user, *APPROVERS) else None,
        items_for_operator=waiting_for_operator(counts) if has_role(user, OPERATOR) else None,
        spend_today=spend_since(start_of_today()),
        paused_jobs=paused_jobs_of(user),
    )


def paused_jobs_of(user, shown: int = 5) -> list[Job]:
    """Jobs paused by a budget or a billing refusal that wait for this person (rule 18)."""
    paused = Job.objects.filter(state=JobState.PAUSED).order_by("updated_at")
    if not has_role(user, ADMIN):
        paused = paused.filter(owner=user)
    return list(paused[:shown])


@require_GET
@login_required
@role_required(*VIEWERS)
def dashboard(request: HtmxHttpRequest) -> HttpResponse:
    """What waits for the person looking, then the jobs (the jobs' panel alone polls)."""
    return render_jobs(
        request,
        "dashboard.html",
        Job.objects.order_by("-created_at", "-id"),
        can_start=has_role(request.user, *APPROVERS),
        waiting=None if wants_partial(request) else waiting_for(request.user),
    )


@require_GET
@login_required
@role_required(*VIEWERS)
def job_list(request: HtmxHttpRequest) -> HttpResponse:
    jobs = Job.objects.select_related("owner").order_by("-created_at", "-id")
    filters = JobFilterForm(request.GET)
    if filters.is_valid():
        if state := filters.cleaned_data["state"]:
            jobs = jobs.filter(state=state)
        if reference := filters.cleaned_data["reference"]:
            jobs = jobs.filter(reference__icontains=reference)
    return render_jobs(
        request, "job_list.html", jobs, filters=filters, can_start=has_role(request.user, *APPROVERS)
    )


# --- starting a job ------------------------------------------------------------------------

# The estimate renders the prompt for a sample of the chosen products, not all of them.
ESTIMATE_SAMPLE = 50


@dataclass(frozen=True)
class Estimate:
    """What a job would cost before it starts, from `ledger.money.pricing` at the batch price.

    Tokens per request as `ledger.money.estimates.request_estimate` finds them (the one rule, shared
    with an import's preview, a retry's and a regeneration's cost): measured on the prompt version and
    model's pilot or earlier jobs, else guessed over a sample of the products; `per_request` says
    which. A model without a known price has no cost: `price_note` says so.
    """

    requests: int
    submissions: int
    sample_size: int
    per_request: RequestEstimate
    price: Price | None
    provider: str
    model: str
    # The provider reports usage only for a whole batch: each draft's tokens will be its share.
    apportioned: bool = False
    budget: Decimal | None = None  # in the business currency

    @property
    def over_budget(self) -> bool:
        """The estimate passes the budget: the job will pause before it is done (rule 18)."""
        if self.budget is None or self.cost is None:
            return False
        shown = in_business_currency(self.cost)
        return shown.converted and shown.amount > self.budget

    @property
    def input_tokens_per_request(self) -> int:
        return self.per_request.input_tokens

    @property
    def output_tokens_per_request(self) -> int:
        return self.per_request.output_tokens

    @property
    def input_tokens(self) -> int:
        return self.requests * self.input_tokens_per_request

    @property
    def output_tokens(self) -> int:
        return self.requests * self.output_tokens_per_request

    @property
    def cost(self) -> Decimal | None:
        if self.price is None:
            return None
        return self.price.cost(self.input_tokens, self.output_tokens).quantize(PLACES)

    @property
    def price_note(self) -> str:
        return unknown_price(self.provider, self.model) if self.price is None else self.price.note


def estimate_job(form: JobStartForm) -> Estimate:
    """Needs a valid form: its selected products and prompt version."""
    prompt, data = form.prompt, form.cleaned_data
    requests = form.products.count()
    sample = form.products.select_related("current_revision").order_by("sku")[:ESTIMATE_SAMPLE]
    contents = [(product.current_revision.title, product.current_revision.fields) for product in sample]
    return Estimate(
        requests=requests,
        submissions=math.ceil(requests / data["unit_size"]),
        sample_size=len(contents),
        per_request=request_estimate(prompt, contents, provider=data["provider"], model=data["model"]),
        price=price_for(data["provider"], data["model"]),
        provider=data["provider"],
        model=data["model"],
        apportioned=not capabilities(data["provider"]).usage_per_request,
        budget=data.get("budget"),
    )


def new_reference(task: str) -> str:
    """The task and the time, with a counter when two jobs start within the same second."""
    base = f"{task}-{timezone.now():%Y%m%d-%H%M%S}"
    reference, n = base, 1
    while Job.objects.filter(reference=reference).exists():
        n += 1
        reference = f"{base}-{n}"
    return reference


def started_by_form(token: UUID) -> Job | None:
    """The job a start form with this token has started, if it has."""
    found = JobStartToken.objects.filter(token=token, job__isnull=False).select_related("job").first()
    return found.job if found else None


def shown_again(request: HtmxHttpRequest, job: Job) -> HttpResponse:
    """A start form sent again (double click, Back then Start, a refresh): the job it started, not a second."""
    messages.info(
        request,
        f"This form started job {job.reference} already; nothing more was started. "
        "To start another job, open a new start form.",
    )
    return redirect("job_detail", job.pk)


@require_http_methods(["GET", "POST"])
@login_required
@role_required(*VIEWERS)
def job_start(request: HtmxHttpRequest) -> HttpResponse:
    """Choose the work, see what it would cost (a confirm step without JavaScript), then start it,
    once per form: its one-time token (`JobStartToken`) is written in the job's own transaction."""
    can_start = has_role(request.user, *APPROVERS)
    context = {"can_start": can_start, "estimate": None}
    if request.method == "GET":
        return render(
            request, "job_start.html", {**context, "form": JobStartForm(), "once": StartTokenForm()}
        )
    if not can_start:
        raise PermissionDenied
    token = StartTokenForm(request.POST).token()
    if token and (job := started_by_form(token)):
        return shown_again(request, job)
    # A form that came without a valid token (a page from before tokens) is given a new one.
    once = StartTokenForm(request.POST) if token else StartTokenForm()
    form = JobStartForm(request.POST)
    context.update(form=form, once=once)
    if not form.is_valid():
        return render(request, "job_start.html", context, status=400)
    context["estimate"] = estimate_job(form)
    if request.POST.get("step") != "start":
        return render(request, "job_start.html", {**context, "confirm": True})
    if token is None:
        form.add_error(
            None,
            "This form had no one-time token, so it could not be told from a repeat: check the estimate and start again.",
        )
        return render(request, "job_start.html", {**context, "confirm": True}, status=400)
    fields = form.job_fields()
    try:
        # The token first: a second send of this form waits here until the first has committed.
        with transaction.atomic():
            claim = JobStartToken.objects.create(token=token, person=request.user)
            job = create_job(
                **{**fields, "reference": fields["reference"] or new_reference(fields["task"])},
                owner=request.user,
                skus=form.job_skus(),
            )
            claim.job = job
            claim.save(update_fields=["job"])
    except NotAllowed as exc:
        form.add_error(None, str(exc))
        return render(request, "job_start.html", context, status=409)
    except IntegrityError:
        if job := started_by_form(token):  # the same form, sent again while the first send started it
            return shown_again(request, job)
        # Another person took the reference at the same moment.
        form.add_error("reference", "A job with this reference exists already.")
        return render(request, "job_start.html", context, status=409)
    # create_job analyses the tables it filled once its rows are committed; inside this transaction it could not.
    requests = context["estimate"].requests
    analyse_after_bulk_change({Item: requests, Event: requests})
    messages.success(request, f"Job {job.reference} started with {requests} items.")
    return redirect("job_detail", job.pk)


@require_POST
@login_required
@role_required(*APPROVERS)
def job_estimate(request: HtmxHttpRequest) -> HttpResponse:
    """The estimate panel of the start form, redrawn by htmx as its inputs change."""
    form = JobStartForm(request.POST)
    estimate = estimate_job(form) if form.is_valid() else None
    return render(request, "job_start.html#estimate", {"form": form, "estimate": estimate, "can_start": True})


# --- one job -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubmissionRow:
    submission: Submission

    @property
    def request_counts(self) -> str:
        return ", ".join(f"{name} {count}" for name, count in (self.submission.request_counts or {}).items())

    @property
    def answers_at_once(self) -> bool:
        return answers_at_once(self.submission.provider)

    @property
    def anomalies(self) -> list[tuple[str, str]]:
        """(kind, details) of each anomaly; details as `key: value` text, never markup."""
        return [
            (
                str(anomaly.get("kind", "anomaly")),
                ", ".join(
                    f"{key}: {value if isinstance(value, str) else json.dumps(value)}"
                    for key, value in anomaly.items()
                    if key != "kind"
                ),
            )
            for anomaly in self.submission.anomalies or []
        ]


def job_progress(job: Job, submissions_page: str | None = None) -> dict:
    """What moves while a job works: item counts by state (from its tallies) and a page of its
    submissions (`submissions_page`: a page number or cursor, review/paging.py), with their count."""
    by_state = ItemTally.objects.filter(job=job).counts_by_state()
    submissions = screen_page(
        job.submissions.all(),
        order=["id"],
        per_page=SUBMISSIONS_PER_PAGE,
        page=submissions_page,
        count=job.submissions.count,
    )
    return {
        "by_state": by_state,
        "counts": state_counts(by_state),
        "needs_attention": waiting_for_operator(by_state),
        "submissions_page": submissions,
        "submissions": [SubmissionRow(s) for s in submissions.object_list],
    }


@dataclass
class BudgetView:
    """The job's budget as it stands now (`figures`, None without a budget), whether this person may
    change it, and, for a job its budget paused, what it waits for."""

    currency: str
    figures: BudgetFigures | None
    may_change: bool
    paused_by_budget: bool = False

    @property
    def waiting_for(self) -> str:
        """What a job its budget paused waits for, with the figures of now ("" otherwise)."""
        if not self.paused_by_budget or self.figures is None:
            return ""
        return self.figures.waiting_for(lambda amount: money_text(amount, self.currency))


def job_budget_view(job: Job, *, may_change: bool) -> BudgetView | None:
    """The job's budget and what is spent, held and left now; None when there is none to show."""
    if job.budget is None and not (may_change and job.state not in (JobState.CANCELLED, JobState.COMPLETED)):
        return None
    paused_by_budget = job.state == JobState.PAUSED and job.pause_reason == PauseReason.BUDGET_REACHED
    next_needs = next_request_need(job) if paused_by_budget else None
    return BudgetView(
        job.budget_currency or business_currency(),
        budgets.figures(job, next_needs=next_needs),
        may_change,
        paused_by_budget,
    )


# The job page's items table: the columns it sorts by. Not the revision's number: sorting by it reads
# every revision of the catalogue (0.3 s at 50,000), and a job's items mostly share one.
JOB_ITEM_COLUMNS = [Column("sku", "SKU", "product__sku"), Column("state", "State", "state")]


@require_GET
@login_required
@role_required(*VIEWERS)
def job_detail(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    """The job page. While the job works, its progress panel polls every 2 s and its cost panel
    (a heavier aggregate over every draft) every 10 s; each poll names its panel as the htmx target."""
    job = get_object_or_404(Job.objects.select_related("owner", "prompt_version"), pk=job_id)
    polling = job.state in WORKING_JOB_STATES
    if wants_partial(request) and request.htmx.target == "job-cost":
        context = {"job": job, "cost": job_cost(job), "polling": polling}
        return polled(render(request, "job_detail.html#cost", context), polling)
    submissions_page = request.GET.get("submissions_page")
    if wants_partial(request):
        context = {"job": job, **job_progress(job, submissions_page), "polling": polling}
        return polled(render(request, "job_detail.html#progress", context), polling)
    progress = job_progress(job, submissions_page)
    # What a row shows (SKU, revision, state, reason): not the source's fields nor the published text.
    items = job.items.select_related("product", "source_revision").defer(
        "source_revision__fields", "product__published_content"
    )
    # How many match: from the tallies, unless a SKU is searched for (then counted, up to a cap).
    count: int | Callable = sum(progress["by_state"].values())
    filters = ItemFilterForm(request.GET)
    sku_capped = False
    if filters.is_valid():
        if state := filters.cleaned_data["state"]:
            items = items.filter(state=state)
            count = progress["by_state"].get(state, 0)
        if sku := filters.cleaned_data["sku"]:
            found = products_with_sku(sku, cap=SKU_PRODUCTS_CAP)
            if found is None:  # a SKU text common in the catalogue: the items' join finds rows soon
                items = items.filter(product__sku__icontains=sku)
                count = partial(capped_count, items)
            else:
                # The products through the SKU's index, then this job's items of them by key (asked
                # in one query, the planner may read the job's items in order to meet a few).
                products, sku_capped = found
                matching = list(
                    items.order_by()
                    .filter(among("product", products))
                    .values_list("pk", flat=True)[: COUNT_CAP + 1]
                )
                items = items.filter(among("id", matching[:COUNT_CAP]))
                count = (min(len(matching), COUNT_CAP), len(matching) > COUNT_CAP)
    by_field = FieldFilterForm(request.GET)
    if by_field.active:
        items = with_field(items, by_field)
        count = partial(capped_count, items)
    sort = sorting(request.GET, JOB_ITEM_COLUMNS, default=["id"])
    if sort.refused:
        messages.warning(request, sort.refused)
    page = screen_page(
        sort.apply(items),
        order=sort.order,
        per_page=ITEMS_PER_PAGE,
        page=request.GET.get("page"),
        count=count,
    )
    for item in page.object_list:
        item.detail_url = url_of("item_detail", item.pk)
    context = {
        "job": job,
        **progress,
        "cost": job_cost(job),
        "polling": polling,
        "filters": filters,
        "by_field": by_field,
        "headings": sort.headings,
        "sku_capped": sku_capped,
        "found_cap": SKU_PRODUCTS_CAP,
        "page": page,
    }
    context["budget"] = job_budget_view(job, may_change=may_spend(request.user, job))
    context["receipts"] = job_receipts(job, context["cost"])
    context["notifications"], context["notification_count"] = job_notifications(job)
    context["notify_url_shown"] = shown_notify_url(request.user, job)
    context["answers_shown"] = may_see_recipients(request.user, job)
    if job.state != JobState.CANCELLED and may_cancel(request.user, job):
        # What cancel_job would stop: the items from the counts on the page, the running batches counted.
        cancel = {
            "items": sum(context["by_state"].get(state, 0) for state in CANCELLABLE_ITEM_STATES),
            "batches": job.submissions.filter(state=SubmissionState.OPEN).count(),
        }
        context["cancel"] = cancel if cancel["items"] or cancel["batches"] else None
    return render(request, "job_detail.html", context, status=400 if by_field.errors else 200)


def job_to_spend_on(request: HtmxHttpRequest, job_id: int) -> Job:
    """The job whose money the person changes (its budget, going on after a pause): 404 unknown, 403
    when it is not theirs to spend on."""
    job = get_object_or_404(Job, pk=job_id)
    if not may_spend(request.user, job):
        raise PermissionDenied
    return job


class BudgetForm(forms.Form):
    budget = BudgetField()


@require_POST
@login_required
@role_required(*APPROVERS)
def job_budget(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    """Give the job a budget or raise it; a job paused by its budget goes on (rule 18)."""
    job = job_to_spend_on(request, job_id)
    form = BudgetForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Nothing was changed: " + " ".join(form.errors["budget"]))
        return redirect("job_detail", job.pk)
    was_paused = job.state == JobState.PAUSED
    try:
        job = set_budget(job.pk, form.cleaned_data["budget"], actor=request.user)
    except NotAllowed as refusal:
        messages.error(request, f"Nothing was changed: {refusal}.")
    else:
        goes_on = " The job goes on." if was_paused and job.state != JobState.PAUSED else ""
        messages.success(request, f"Budget set to {money_text(job.budget, job.budget_currency)}.{goes_on}")
    return redirect("job_detail", job.pk)


@require_POST
@login_required
@role_required(*APPROVERS)
def job_resume(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    """A paused job goes on (after a billing refusal, once the account can pay again)."""
    job = job_to_spend_on(request, job_id)
    try:
        resume_job(job.pk, actor=request.user)
    except NotAllowed as refusal:
        messages.error(request, f"Nothing was changed: {refusal}.")
    else:
        messages.success(request, f"Job {job.reference} goes on: its waiting batches are sent next.")
    return redirect("job_detail", job.pk)


@require_POST
@login_required
@role_required(OPERATOR, *APPROVERS)
def job_cancel(request: HtmxHttpRequest, job_id: int) -> HttpResponse:
    """Cancel what of the job has not been used yet; its batches at the provider are asked to stop."""
    job = get_object_or_404(Job, pk=job_id)
    if not may_cancel(request.user, job):
        raise PermissionDenied
    try:
        outcome = cancel_job(job_id=job.pk, actor=request.user)
    except NotAllowed as refusal:
        messages.error(request, str(refusal))
    else:
        stopping = outcome["batches_to_stop"]
        messages.success(
            request,
            f"Job {job.reference} cancelled: {outcome['items_cancelled']} items cancelled"
            + (f"; {stopping} batches at the provider are being asked to stop." if stopping else "."),
        )
    return redirect("job_detail", job.pk)
