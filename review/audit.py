"""Audit (SPEC §8), for admins: who approved which version when and what they changed, who rejected
which draft and why, as a page and as CSV, and the full event log of any item."""

import csv
import heapq
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime
from functools import cached_property

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.db.models import BigIntegerField, OuterRef, Q, QuerySet, Subquery
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_GET

from ledger.models import Approval, Event, GeneratedVersion, Item

from .common import DatesFilter, url_of, word_diff
from .display import time_text
from .forms import JobReferenceField
from .paging import capped_screen_page
from .permissions import ADMIN, role_required
from .streaming import streamed_file

APPROVALS_PER_PAGE = 50
# Comparing word by word costs up to the square of the length; longer texts are shown without a diff.
DIFF_CHAR_LIMIT = 20_000


class ApprovalFilter(DatesFilter):
    # The dates last, as the page shows the fields (and lists their errors).
    field_order = ("decision", "person", "job", "since", "until")

    decision = forms.ChoiceField(
        required=False,
        choices=[("", "Approvals"), ("rejected", "Rejections")],
        label="Decisions",
    )
    person = forms.ModelChoiceField(
        queryset=get_user_model().objects.none(),
        to_field_name="username",
        required=False,
        empty_label="Everyone",
        label="Decided by",
    )
    job = JobReferenceField()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Only people who have decided something: the list stays short and every choice finds rows.
        approvers = Approval.objects.values("approved_by")
        rejecters = Event.objects.rejections().filter(actor__isnull=False).values("actor")
        self.fields["person"].queryset = (
            get_user_model().objects.filter(Q(pk__in=approvers) | Q(pk__in=rejecters)).order_by("username")
        )

    def approvals(self) -> QuerySet[Approval]:
        """The approvals the (valid) filter selects, newest first."""
        return self.narrowed(
            Approval.objects.order_by("-approved_at", "-id"), by="approved_by", at="approved_at"
        )

    def rejections(self) -> QuerySet[Event]:
        """The rejections the (valid) filter selects, newest first, each with the draft it named."""
        return with_rejected_draft(
            self.narrowed(
                Event.objects.rejections(undone_too=True).order_by("-at", "-id"), by="actor", at="at"
            )
        )

    def narrowed(self, decisions: QuerySet, *, by: str, at: str) -> QuerySet:
        """The decisions taken by the person chosen, on the job's items, between the days chosen
        (`by` and `at`: the fields naming who decided and when)."""
        data = self.cleaned_data
        if data["person"]:
            decisions = decisions.filter(**{by: data["person"]})
        if data["job"]:
            decisions = decisions.filter(item__job=data["job"])
        if data["since"]:
            decisions = decisions.filter(**{f"{at}__date__gte": data["since"]})
        if data["until"]:
            decisions = decisions.filter(**{f"{at}__date__lte": data["until"]})
        return decisions


def with_rejected_draft(events: QuerySet[Event]) -> QuerySet[Event]:
    """Events annotated with the draft their `data.version` names: its number, hash and text."""
    drafts = GeneratedVersion.objects.filter(pk=OuterRef("version_id"))
    return events.annotate(
        version_id=Cast(KeyTextTransform("version", "data"), BigIntegerField()),
        version_number=Subquery(drafts.values("number")[:1]),
        version_hash=Subquery(drafts.values("content_hash")[:1]),
        version_content=Subquery(drafts.values("content")[:1]),
        version_expired_at=Subquery(drafts.values("content_expired_at")[:1]),
    )


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
    "version__valid",
    "undone_at",
)


class DecisionRow:
    """What every row of the audit shows of a decision: links to its item and event log, and when it
    was taken. Made in Python: fifty rows of `{% url %}` and `|date` took a sixth of the page's time."""

    @property
    def item_id(self) -> int:
        raise NotImplementedError

    @property
    def decided_at(self) -> datetime:
        raise NotImplementedError

    @property
    def item_url(self) -> str:
        return url_of("item_detail", self.item_id)

    @property
    def events_url(self) -> str:
        return url_of("audit_events", self.item_id)

    @cached_property
    def at(self) -> datetime:
        """In the current time zone, as the `date` filter shows it."""
        return timezone.localtime(self.decided_at)

    @property
    def at_iso(self) -> str:
        return self.at.isoformat()

    @property
    def at_shown(self) -> str:
        return time_text(self.at)


@dataclass(frozen=True)
class AuditRow(DecisionRow):
    approval: Approval
    diff: list[tuple[str, str]] | None

    @property
    def item_id(self) -> int:
        return self.approval.item_id

    @property
    def decided_at(self) -> datetime:
        return self.approval.approved_at

    @property
    def job_url(self) -> str:
        return url_of("job_detail", self.approval.item.job_id)


@dataclass(frozen=True)
class RejectionRow(DecisionRow):
    event: Event

    @property
    def item_id(self) -> int:
        return self.event.item_id

    @property
    def decided_at(self) -> datetime:
        return self.event.at


def rejections_page(request: HttpRequest, filters: ApprovalFilter) -> HttpResponse:
    events = (
        filters.rejections()
        .select_related("item__job", "item__product")
        .defer("item__product__published_content")
        if filters.is_valid()
        else Event.objects.none()
    )
    page = capped_screen_page(
        events, page=request.GET.get("page"), order=["-at", "-id"], per_page=APPROVALS_PER_PAGE
    )
    csv_query = request.GET.copy()
    csv_query.pop("page", None)
    context = {
        "filters": filters,
        "page": page,
        "rejections": [RejectionRow(event) for event in page.object_list],
        "csv_query": csv_query.urlencode(),
    }
    return render(request, "audit.html", context)


@require_GET
@login_required
@role_required(ADMIN)
def audit(request: HttpRequest) -> HttpResponse:
    filters = ApprovalFilter(request.GET)
    if filters.is_valid() and filters.cleaned_data["decision"] == "rejected":
        return rejections_page(request, filters)
    approvals = (
        filters.approvals()
        .select_related("approved_by", "item__job", "item__product", "version")
        # What a row shows: a fraction of the columns of the six rows it joins.
        .only(*AUDIT_ROW_FIELDS)
        if filters.is_valid()
        else Approval.objects.none()
    )
    page = capped_screen_page(
        approvals, page=request.GET.get("page"), order=["-approved_at", "-id"], per_page=APPROVALS_PER_PAGE
    )
    rows = [AuditRow(a, edit_of(a) if a.edited else None) for a in page.object_list]
    csv_query = request.GET.copy()
    csv_query.pop("page", None)
    context = {
        "filters": filters,
        "page": page,
        "rows": rows,
        "rejections": None,  # the approvals are shown
        "csv_query": csv_query.urlencode(),
    }
    return render(request, "audit.html", context)


# --- CSV -----------------------------------------------------------------------------------

# Approvals and rejections in one file, newest first: a rejection's `reason` is the reviewer's, and it
# has no final text.
CSV_COLUMNS = (
    "decision",
    "decided_at",
    "decided_by",
    "job",
    "sku",
    "item_id",
    "version_number",
    "version_id",
    "content_hash",
    "edited",
    "note",
    "reason",
    "generated_content",
    "final_content",
    "reason_code",
    "undone_at",
)
APPROVAL_FIELDS = (
    "approved_at",
    "approved_by__username",
    "item__job__reference",
    "item__product__sku",
    "item_id",
    "version__number",
    "version_id",
    "version_hash",
    "edited",
    "note",
    "version__content",
    "final_content",
    "undone_at",
)
REJECTION_FIELDS = (
    "at",
    "actor_name",
    "item__job__reference",
    "item__product__sku",
    "item_id",
    "version_number",
    "version_id",
    "version_hash",
    "reason",
    "version_content",
    "data__reason_code",
    "undone_at",
)
# Spreadsheet programs read a CSV file as UTF-8 only when it starts with a byte-order mark ("°C").
BYTE_ORDER_MARK = "\ufeff"
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


def approval_rows(approvals: QuerySet[Approval]) -> Iterator[tuple]:
    # A server-side cursor on PostgreSQL: rows arrive in chunks, never all at once.
    for row in approvals.values_list(*APPROVAL_FIELDS).iterator(chunk_size=500):
        *decided, note, generated, final, undone_at = row
        yield ("approved", *decided, note, "", generated, final, "", undone_at)  # an approval has no reason


def rejection_rows(rejections: QuerySet[Event]) -> Iterator[tuple]:
    for row in rejections.values_list(*REJECTION_FIELDS).iterator(chunk_size=500):
        at, by, job, sku, item, number, version, digest, reason, generated, code, undone_at = row
        yield (
            "rejected",
            at,
            by,
            job,
            sku,
            item,
            number,
            version,
            digest,
            False,
            "",
            reason,
            generated,
            "",
            code,
            undone_at,
        )


def csv_lines(approvals: QuerySet[Approval], rejections: QuerySet[Event]) -> Iterator[str]:
    # Every cell quoted: no spreadsheet guesses that a hash or an id is a number or a date.
    writer = csv.writer(Echo(), quoting=csv.QUOTE_ALL)
    yield BYTE_ORDER_MARK + writer.writerow(CSV_COLUMNS)
    # Both newest first, merged by the time of the decision.
    decisions = heapq.merge(
        approval_rows(approvals), rejection_rows(rejections), key=lambda row: row[1], reverse=True
    )
    for row in decisions:
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
    return streamed_file(
        request,
        csv_lines(filters.approvals(), filters.rejections()),
        content_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="decisions-{stamp}.csv"'},
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
    comments = item.comments.select_related("author")
    return render(request, "audit_events.html", {"item": item, "events": events, "comments": comments})
