"""Draft quality (SPEC §8, `/quality/`), for every role: acceptance, edits, time to decide and
rejection reasons by prompt version, provider, model, category and over time, with charts; quick
approvals (possible rubber-stamping) by reviewer; the grouped figures as CSV. What each figure means
is defined once, in `ledger/quality.py`; this module reads the filters and shows the figures."""

import csv
import io
from dataclasses import dataclass
from datetime import timedelta

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from ledger.models import Job, PromptVersion
from ledger.money.cost_groups import (
    FIELD_NAME,
    FIELD_NAME_RULE,
    STATE,
    CostsAcrossJobs,
    GroupCost,
    TooManyGroups,
    costs_across_jobs,
    costs_by_set_up,
)
from ledger.money.currency import business_currency
from ledger.quality import (
    DIMENSIONS,
    EDIT_SAMPLE,
    PERIODS,
    WEEK,
    Figures,
    Report,
    Scope,
    latest_decision_day,
    measure,
    rejection_codes,
    rejection_reasons,
    reviewers,
)

from .audit import BYTE_ORDER_MARK, csv_cell
from .common import DatesFilter
from .ids import IdField
from .permissions import VIEWERS, role_required

# What the page measures when nothing narrows it.
DEFAULT_DAYS = 90
# Cost by a product field is read only when asked for (or one job is chosen): by this one unless
# another is asked for; the dearest groups are shown, the rest added up in one row.
DEFAULT_COST_BY = "category"
COST_GROUPS_SHOWN = 15
# Pairs of a job and a group read for the cost table at most (a field with a value per product has
# too many: each item's cost is in the job's export).
COST_ROWS_READ = 10_000


class QualityFilter(DatesFilter):
    job = IdField(required=False, label="Job id", widget=forms.NumberInput(attrs={"min": 1}))
    prompt_version = forms.TypedChoiceField(
        required=False, coerce=int, empty_value=None, label="Prompt version"
    )
    period = forms.ChoiceField(required=False, choices=list(PERIODS.items()), label="Over time by")
    cost_by = forms.CharField(
        required=False,
        label="Cost by",
        max_length=64,
        widget=forms.TextInput(attrs={"placeholder": DEFAULT_COST_BY, "size": 10}),
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        versions = PromptVersion.objects.order_by("task", "version").values_list("pk", "task", "version")
        self.fields["prompt_version"].choices = [
            ("", "Every prompt version"),
            *((str(pk), f"{task} v{version}") for pk, task, version in versions),
        ]

    def clean_job(self) -> Job | None:
        job_id = self.cleaned_data["job"]
        if job_id is None:
            return None
        job = Job.objects.filter(pk=job_id).first()
        if job is None:
            raise forms.ValidationError(f"There is no job {job_id}.")
        return job

    def clean_cost_by(self) -> str:
        by = self.cleaned_data["cost_by"].strip()
        if by and not FIELD_NAME.fullmatch(by):
            raise forms.ValidationError(f"Give {FIELD_NAME_RULE}.")
        return by

    @property
    def problems(self) -> list[str]:
        """Every error, with the field it is about, for a page or a plain-text answer."""
        labels = {name: field.label for name, field in self.fields.items()}
        return [
            f"{labels[name]}: {error}" if name in labels else error
            for name, errors in self.errors.items()
            for error in errors
        ]

    @property
    def default_window(self) -> bool:
        """Nothing narrows the page: it measures the DEFAULT_DAYS up to the latest decision, not
        every decision ever made (each is read: at a million, a page would take many seconds)."""
        data = self.cleaned_data
        return not (data["since"] or data["until"] or data["job"] or data["prompt_version"])

    def scope(self) -> Scope:
        data = self.cleaned_data
        since = data["since"]
        if self.default_window and (latest := latest_decision_day()) is not None:
            since = latest - timedelta(days=DEFAULT_DAYS - 1)
        return Scope(
            since=since,
            until=data["until"],
            job_id=data["job"].pk if data["job"] else None,
            prompt_version_id=data["prompt_version"],
        )

    def over_time_by(self) -> str:
        return self.cleaned_data["period"] or WEEK


def rate_series(groups: list[Figures]) -> list[dict]:
    """Acceptance, edit and first-draft usable rates in percent, for a chart (None where there is
    nothing to divide)."""

    def percent(value: float | None) -> float | None:
        return None if value is None else round(100 * value, 1)

    return [
        {"label": "Acceptance rate", "tone": "ok", "values": [percent(f.acceptance_rate) for f in groups]},
        {"label": "Edit rate", "tone": "warn", "values": [percent(f.edit_rate) for f in groups]},
        {
            "label": "First drafts usable",
            "tone": "usable",
            "values": [percent(f.first_draft_usable_rate) for f in groups],
        },
    ]


def charts(report: Report) -> dict[str, dict]:
    """What `static/quality.js` draws on each `<canvas data-chart=…>`; the tables beside the
    charts hold the same figures."""
    over_time = report.over_time
    shown = {
        "over-time-rates": {
            "type": "line",
            "unit": "%",
            "labels": [f.label for f in over_time],
            "series": rate_series(over_time),
        },
        "over-time-decisions": {
            "type": "bar",
            "stacked": True,
            "labels": [f.label for f in over_time],
            "series": [
                {"label": "Approved", "tone": "ok", "values": [f.approved for f in over_time]},
                {"label": "Rejected", "tone": "bad", "values": [f.rejected for f in over_time]},
            ],
        },
    }
    for dimension, groups in report.groups.items():
        shown[f"by-{dimension}"] = {
            "type": "bar",
            "unit": "%",
            "labels": [f.label for f in groups],
            "series": rate_series(groups),
        }
    return shown


@dataclass(frozen=True)
class CostBar:
    """One group's row of the cost chart: its share of the dearest group's amount, as a bar's width."""

    group: GroupCost
    percent: str


def cost_table(costs: CostsAcrossJobs) -> tuple[list[GroupCost], list[CostBar]]:
    """The dearest `COST_GROUPS_SHOWN` groups, the rest added up in one "other values" row, and the
    chart's bars for them."""
    shown = list(costs.groups[:COST_GROUPS_SHOWN])
    if rest := costs.groups[COST_GROUPS_SHOWN:]:
        other = GroupCost(key=f"Other values ({len(rest)})", currency=costs.currency)
        for group in rest:
            other.add(group)
        shown.append(other)
    dearest = max((group.amount or 0 for group in shown), default=0)
    bars = [
        CostBar(group, f"{100 * (group.amount or 0) / dearest:.1f}" if dearest else "0") for group in shown
    ]
    return shown, bars


def cost_context(scope: Scope, asked: str, query: QueryDict) -> dict:
    """What the cost panel shows: the scope's jobs' cost by their prompt version and model, from each
    job's tallies, whatever its size. By a product field only when one is asked for (`asked`) or one
    job is chosen (by category then, or by the item's state when no product has a category): that reads
    every item of the jobs, so a visit never reads a million items it was not asked to. Without it,
    `cost_by_query` is the page's query asking for the cost by category."""
    jobs, currency = scope.jobs(), business_currency()
    set_up_costs = costs_by_set_up(jobs, currency)
    set_up_groups, set_up_bars = cost_table(set_up_costs)
    context = {
        "set_up_costs": set_up_costs,
        "set_up_groups": set_up_groups,
        "set_up_bars": set_up_bars,
        "cost_by": asked or DEFAULT_COST_BY,
    }
    if not (asked or scope.job_id):
        by_category = query.copy()
        by_category["cost_by"] = DEFAULT_COST_BY
        return {**context, "cost_by_query": by_category.urlencode()}
    try:
        costs = costs_across_jobs(jobs, context["cost_by"], currency, limit=COST_ROWS_READ)
        if not asked and costs.groups and all(group.key is None for group in costs.groups):
            context["cost_by"] = STATE
            costs = costs_across_jobs(jobs, STATE, currency, limit=COST_ROWS_READ)
    except TooManyGroups:
        context["cost_problem"] = (
            f"{context['cost_by']} has too many values to show here: each item's cost is in its job's export."
        )
        return context
    context["cost_groups"], context["cost_bars"] = cost_table(costs)
    return {**context, "field_costs": costs}


@require_GET
@login_required
@role_required(*VIEWERS)
def quality(request: HttpRequest) -> HttpResponse:
    filters = QualityFilter(request.GET)
    if not filters.is_valid():
        return render(request, "quality.html", {"filters": filters}, status=400)
    scope = filters.scope()
    report = measure(scope, period=filters.over_time_by())
    quick_seconds = settings.BATCHDESK_RUBBER_STAMP_SECONDS
    rejected = report.total.rejected
    reasons = rejection_reasons(scope)
    other_reasons = rejected - sum(count for _, count in reasons)
    context = {
        "filters": filters,
        "job": filters.cleaned_data["job"],
        "report": report,
        "reasons": [(reason, count, count / rejected) for reason, count in reasons],
        "reason_codes": [
            (code, label, count, count / rejected) for code, label, count in rejection_codes(scope)
        ],
        "other_reasons": other_reasons,
        "other_share": other_reasons / rejected if rejected else None,
        "reviewers": reviewers(scope, quick_seconds),
        "quick_seconds": quick_seconds,
        "dimensions": [(name, label, report.groups[name]) for name, label in DIMENSIONS.items()],
        "period_label": PERIODS[report.period],
        "charts": charts(report),
        "csv_query": request.GET.urlencode(),
        "sample_limit": EDIT_SAMPLE,
        "default_days": DEFAULT_DAYS if filters.default_window else None,
        **cost_context(scope, filters.cleaned_data["cost_by"], request.GET),
    }
    return render(request, "quality.html", context)


# --- CSV -----------------------------------------------------------------------------------

CSV_COLUMNS = (
    "dimension",
    "group",
    "decided",
    "approved",
    "rejected",
    "acceptance_rate",
    "first_drafts",
    "usable_first_drafts",
    "first_draft_usable_rate",
    "edited",
    "edit_rate",
    "edit_distance",
    "edit_distance_sample",
    "seconds_to_decide",
)


def csv_row(dimension: str, figures: Figures) -> list:
    def exact(value: float | None, places: int) -> str:
        return "" if value is None else f"{value:.{places}f}"

    return [
        dimension,
        figures.label,
        figures.decided,
        figures.approved,
        figures.rejected,
        exact(figures.acceptance_rate, 4),
        figures.first_drafts,
        figures.usable_first_drafts,
        exact(figures.first_draft_usable_rate, 4),
        figures.edited,
        exact(figures.edit_rate, 4),
        exact(figures.edit_distance, 4),
        figures.sampled,
        exact(figures.seconds_to_decide, 1),
    ]


def csv_text(report: Report) -> str:
    """Every group of every dimension, one row each, after the row of all decisions; shares from 0
    to 1 and seconds, as the page defines them."""
    out = io.StringIO()
    out.write(BYTE_ORDER_MARK)
    # Every cell quoted: no spreadsheet guesses that a category or a day is a number or a date.
    writer = csv.writer(out, quoting=csv.QUOTE_ALL)
    writer.writerow(CSV_COLUMNS)
    rows = [csv_row("all", report.total)]
    for dimension, groups in report.groups.items():
        rows += [csv_row(dimension, figures) for figures in groups]
    rows += [csv_row(report.period, figures) for figures in report.over_time]
    writer.writerows([csv_cell(value) for value in row] for row in rows)
    return out.getvalue()


@require_GET
@login_required
@role_required(*VIEWERS)
def quality_csv(request: HttpRequest) -> HttpResponse:
    filters = QualityFilter(request.GET)
    if not filters.is_valid():
        return HttpResponse(
            f"Nothing was exported: {'; '.join(filters.problems)}\n", status=400, content_type="text/plain"
        )
    report = measure(filters.scope(), period=filters.over_time_by())
    stamp = timezone.now().strftime("%Y%m%d-%H%M")
    return HttpResponse(
        csv_text(report),
        content_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="quality-{stamp}.csv"'},
    )
