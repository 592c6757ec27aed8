"""Audit (SPEC §8), for admins: who approved which version when and what they changed, as a page and
as CSV, and the full event log of any item."""

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime
from functools import cached_property, partial

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_GET

from ledger.models import Approval, Item, Job

from .common import url_of, word_diff
from .display import time_text
from .paging import capped_count, screen_page
from .permissions import ADMIN, role_required

APPROVALS_PER_PAGE = 50
# Comparing word by word costs up to the square of the length; longer texts are shown without a diff.
DIFF_CHAR_LIMIT = 20_000


class ApprovalFilter(forms.Form):
    person = forms.ModelChoiceField(
        queryset=get_user_model().objects.none(),
        to_field_name="username",
        required=False,
        empty_label="Everyone",
        label="Approved by",
    )
    job = forms.CharField(required=False, max_length=200, label="Job reference")
    since = forms.DateField(required=False, label="From", widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, label="To", widget=forms.DateInput(attrs={"type": "date"}))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Only people who have approved something: the list stays short and every choice finds rows.
        approvers = Approval.objects.values("approved_by")
        self.fields["person"].queryset = (
            get_user_model().objects.filter(pk__in=approvers).order_by("username")
        )

    def clean_job(self) -> Job | None:
        reference = self.cleaned_data["job"].strip()
        if not reference:
            return None
        job = Job.objects.filter(reference=reference).first()
        if job is None:
            raise forms.ValidationError("No job has this reference.")
        return job

    def clean(self) -> dict:
        data = super().clean()
        since, until = data.get("since"), data.get("until")
        if since and until and since > until:
            raise forms.ValidationError("The start date is after the end date.")
        return data

    def approvals(self) -> QuerySet[Approval]:
        """The approvals the (valid) filter selects, newest first."""
        approvals = Approval.objects.order_by("-approved_at", "-id")
        data = self.cleaned_data
        if data["person"]:
            approvals = approvals.filter(approved_by=data["person"])
        if data["job"]:
            approvals = approvals.filter(item__job=data["job"])
        if data["since"]:
            approvals = approvals.filter(approved_at__date__gte=data["since"])
        if data["until"]:
            approvals = approvals.filter(approved_at__date__lte=data["until"])
        return approvals


# --- edits -------------------------------------------------------------------------------


def edit_of(approval: Approval) -> list[tuple[str, str]] | None:
    """How the approver changed the generated text, word by word; None when too long to compare."""
    generated, final = approval.version.content, approval.final_content
    if len(generated) + len(final) > DIFF_CHAR_LIMIT:
        return None
    return word_diff(generated, final)


# --- the page ------------------------------------------------------------------------------


AUDIT_ROW_FIELDS = (
    "approved_at",
    "approved_by__username",
    "version_hash",
    "edited",
    "note",
    "final_content",
    "item__job__reference",
    "item__product__sku",
    "version__number",
    "version__content",
)


@dataclass(frozen=True)
class AuditRow:
    approval: Approval
    diff: list[tuple[str, str]] | None

    # The row's links and time, made in Python: fifty rows of `{% url %}` and `|date` took a sixth of
    # the page's time.
    @property
    def job_url(self) -> str:
        return url_of("job_detail", self.approval.item.job_id)

    @property
    def item_url(self) -> str:
        return url_of("item_detail", self.approval.item_id)

    @property
    def events_url(self) -> str:
        return url_of("audit_events", self.approval.item_id)

    @cached_property
    def approved_at(self) -> datetime:
        """In the current time zone, as the `date` filter shows it."""
        return timezone.localtime(self.approval.approved_at)

    @property
    def approved_at_iso(self) -> str:
        return self.approved_at.isoformat()

    @property
    def approved_at_shown(self) -> str:
        return time_text(self.approved_at)


@require_GET
@login_required
@role_required(ADMIN)
def audit(request: HttpRequest) -> HttpResponse:
    filters = ApprovalFilter(request.GET)
    approvals = (
        filters.approvals()
        .select_related("approved_by", "item__job", "item__product", "version")
        # What a row shows: a fraction of the columns of the six rows it joins.
        .only(*AUDIT_ROW_FIELDS)
        if filters.is_valid()
        else Approval.objects.none()
    )
    page = screen_page(
        approvals,
        order=["-approved_at", "-id"],
        per_page=APPROVALS_PER_PAGE,
        page=request.GET.get("page"),
        count=partial(capped_count, approvals),
    )
    rows = [AuditRow(a, edit_of(a) if a.edited else None) for a in page.object_list]
    csv_query = request.GET.copy()
    csv_query.pop("page", None)
    context = {"filters": filters, "page": page, "rows": rows, "csv_query": csv_query.urlencode()}
    return render(request, "audit.html", context)


# --- CSV -----------------------------------------------------------------------------------

CSV_COLUMNS = (
    ("approved_at", "approved_at"),
    ("approved_by", "approved_by__username"),
    ("job", "item__job__reference"),
    ("sku", "item__product__sku"),
    ("item_id", "item_id"),
    ("version_number", "version__number"),
    ("version_id", "version_id"),
    ("content_hash", "version_hash"),
    ("edited", "edited"),
    ("note", "note"),
    ("generated_content", "version__content"),
    ("final_content", "final_content"),
)
# A spreadsheet runs a cell starting with one of these as a formula (CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


class Echo:
    """A file-like object that hands back what is written, so csv.writer can feed a stream."""

    def write(self, value: str) -> str:
        return value


def csv_lines(approvals: QuerySet[Approval]) -> Iterator[str]:
    # Every cell quoted: no spreadsheet guesses that a hash or an id is a number or a date.
    writer = csv.writer(Echo(), quoting=csv.QUOTE_ALL)
    yield writer.writerow([name for name, _ in CSV_COLUMNS])
    # A server-side cursor on PostgreSQL: rows arrive in chunks, never all at once.
    for row in approvals.values_list(*(field for _, field in CSV_COLUMNS)).iterator(chunk_size=500):
        yield writer.writerow([csv_cell(value) for value in row])


@require_GET
@login_required
@role_required(ADMIN)
def approvals_csv(request: HttpRequest) -> HttpResponse:
    filters = ApprovalFilter(request.GET)
    if not filters.is_valid():
        problems = "; ".join(str(e) for errors in filters.errors.values() for e in errors)
        return HttpResponse(f"Nothing was exported: {problems}\n", status=400, content_type="text/plain")
    stamp = timezone.now().strftime("%Y%m%d-%H%M")
    return StreamingHttpResponse(
        csv_lines(filters.approvals()),
        content_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="approvals-{stamp}.csv"'},
    )


# --- events --------------------------------------------------------------------------------


@require_GET
@login_required
@role_required(ADMIN)
def item_events(request: HttpRequest, item_id: int) -> HttpResponse:
    item = get_object_or_404(Item.objects.select_related("job", "product", "source_revision"), pk=item_id)
    events = [
        (event, json.dumps(event.data, ensure_ascii=False, sort_keys=True) if event.data else "")
        for event in item.events.order_by("id")
    ]
    return render(request, "audit_events.html", {"item": item, "events": events})
