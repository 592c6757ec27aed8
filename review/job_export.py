"""A job's outcome as a file (SPEC §6 `GET /api/jobs/{id}/export?format=csv|jsonl`, and the job page's
export buttons): one row an item, in item id order, with what became of it: its state, the text
approved for it and by whom, what its drafts cost, and what the destination last said.

The rows are read a chunk of items at a time, by key (`item_job`: the job's items in id order), with
four queries a chunk whatever its size: the items, the approvals that stand, their last destination
attempts, and their drafts' tokens and rates summed. Each chunk is written out before the next is
read, so memory stays flat at a million items and the first bytes leave at once. A chunk is read as
it is then: an export of a job that is still working shows each item as it was when its chunk was
read.

An item's cost is every draft it produced (a retry's included), priced at the job's batch price and
converted at the rate its unit was settled at (`UnitCharge`), as a job's cost is. While a draft's
unit has no kept rate in the business currency (not settled yet, or no rate in force), the item's
cost stays in the provider's currency and `cost_note` says why.

Model output is untrusted: in CSV a cell that a spreadsheet would run as a formula starts with `'`
(`review.audit.csv_cell`), and text that UTF-8 cannot carry becomes U+FFFD; JSONL carries every
string as it is, escaped by JSON where it must be.
"""

import csv
import json
import re
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from decimal import Decimal

from django.contrib.auth.decorators import login_required
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Count, DecimalField, ExpressionWrapper, F, Max, Min, OuterRef, Q, Subquery, Sum
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_GET

from ledger.models import Approval, DestinationAttempt, GeneratedVersion, Item, Job
from ledger.money import PROVIDER_CURRENCY, business_currency
from ledger.pricing import PLACES, price_for, unknown_price
from ledger.states import ItemState

from .api import ApiError, endpoint, not_found
from .audit import BYTE_ORDER_MARK, Echo, csv_cell
from .permissions import VIEWERS, role_required

FORMATS = ("csv", "jsonl")
CONTENT_TYPES = {"csv": "text/csv; charset=utf-8", "jsonl": "application/jsonl; charset=utf-8"}
# Items read and written at a time: four queries each, and a few megabytes of rows at most.
CHUNK_ITEMS = 2000

COLUMNS = (
    "item_id",
    "sku",
    "source_revision",
    "state",
    "label",
    "reason",
    "approved_version",
    "approved_text",
    "edited",
    "reviewer",
    "approved_at",
    "cost",
    "currency",
    "cost_usd",
    "rate",
    "rate_date",
    "rate_source",
    "cost_note",
    "destination",
    "destination_outcome",
    "destination_at",
    "published",
)

WEIGHTED_RATE = "the rates its drafts' units were settled at, weighted"
RATE_PLACES = Decimal("0.00000001")
_json_encoder = DjangoJSONEncoder()


def utc_text(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC, as the API writes times (`2026-12-06T02:38:31.123Z`)."""
    return None if moment is None else _json_encoder.default(moment.astimezone(UTC))


# --- the rows ------------------------------------------------------------------------------


def export_chunks(job: Job) -> Iterator[list[dict]]:
    """The job's items as rows (`COLUMNS`), in id order, a chunk at a time."""
    last_id = 0
    while True:
        chunk = list(
            Item.objects.filter(job=job, pk__gt=last_id)
            .order_by("pk")
            .annotate(
                last_attempt=Subquery(
                    DestinationAttempt.objects.filter(item=OuterRef("pk"))
                    .order_by("-started_at", "-pk")
                    .values("pk")[:1]
                )
            )
            .values(
                "pk",
                "product__sku",
                "source_revision__number",
                "state",
                "reason",
                "approved_version_id",
                "last_attempt",
            )[:CHUNK_ITEMS]
        )
        if not chunk:
            return
        yield rows_of(job, chunk)
        if len(chunk) < CHUNK_ITEMS:
            return
        last_id = chunk[-1]["pk"]


def rows_of(job: Job, items: list[dict]) -> list[dict]:
    approvals = {
        approval["version_id"]: approval
        for approval in Approval.objects.filter(
            version_id__in=[i["approved_version_id"] for i in items if i["approved_version_id"]]
        )
        .order_by()
        .values(
            "version_id", "version__number", "final_content", "edited", "approved_by__username", "approved_at"
        )
    }
    attempts = {
        attempt["pk"]: attempt
        for attempt in DestinationAttempt.objects.filter(
            pk__in=[i["last_attempt"] for i in items if i["last_attempt"]]
        )
        .order_by()
        .values("pk", "destination", "outcome", "started_at", "finished_at")
    }
    costs = drafts_cost(job, [i["pk"] for i in items])
    rows = []
    for item in items:
        approval = approvals.get(item["approved_version_id"]) or {}
        attempt = attempts.get(item["last_attempt"]) or {}
        rows.append(
            {
                "item_id": item["pk"],
                "sku": item["product__sku"],
                "source_revision": item["source_revision__number"],
                "state": item["state"],
                "label": ItemState(item["state"]).label,
                "reason": item["reason"],
                "approved_version": approval.get("version__number"),
                "approved_text": approval.get("final_content"),
                "edited": approval.get("edited"),
                "reviewer": approval.get("approved_by__username"),
                "approved_at": utc_text(approval.get("approved_at")),
                **costs.get(item["pk"], NO_COST),
                "destination": attempt.get("destination"),
                "destination_outcome": attempt.get("outcome"),
                "destination_at": utc_text(attempt.get("finished_at") or attempt.get("started_at")),
                "published": item["state"] == ItemState.APPLIED,
            }
        )
    return rows


NO_COST = {
    "cost": None,
    "currency": None,
    "cost_usd": None,
    "rate": None,
    "rate_date": None,
    "rate_source": None,
    "cost_note": None,
}


def at_rate(tokens: str) -> ExpressionWrapper:
    return ExpressionWrapper(
        F(tokens) * F("submission__charge__rate"), output_field=DecimalField(max_digits=30, decimal_places=8)
    )


def drafts_cost(job: Job, item_ids: list[int]) -> dict[int, dict]:
    """What the drafts of these items cost, each item's in one row of one grouped query: tokens in
    USD at the job's batch price, and in the business currency at the rate each draft's unit kept.
    Items without a draft are left out (no cost yet)."""
    currency = business_currency()
    kept = Q(
        submission__charge__settled_at__isnull=False,
        submission__charge__rate__isnull=False,
        submission__charge__currency=currency,
    )
    unsettled = Q(submission__charge__isnull=True) | Q(submission__charge__settled_at__isnull=True)
    sums = (
        GeneratedVersion.objects.filter(item_id__in=item_ids)
        .order_by()
        .values("item_id")
        .annotate(
            drafts=Count("pk"),
            unsettled=Count("pk", filter=unsettled),
            kept=Count("pk", filter=kept),
            tokens_in=Sum("input_tokens"),
            tokens_out=Sum("output_tokens"),
            input_at_rate=Sum(at_rate("input_tokens"), filter=kept),
            output_at_rate=Sum(at_rate("output_tokens"), filter=kept),
            lowest=Min("submission__charge__rate", filter=kept),
            highest=Max("submission__charge__rate", filter=kept),
            rate_date=Max("submission__charge__rate_date", filter=kept),
            rate_source=Max("submission__charge__rate_source", filter=kept),
        )
    )
    price = price_for(job.provider, job.model)
    costs = {}
    for row in sums:
        if price is None:
            costs[row["item_id"]] = {**NO_COST, "cost_note": unknown_price(job.provider, job.model)}
            continue
        usd = price.cost(row["tokens_in"], row["tokens_out"]).quantize(PLACES)
        if row["kept"] < row["drafts"]:
            why = "not settled yet" if row["unsettled"] else f"no rate to {currency} was in force"
            costs[row["item_id"]] = {
                **NO_COST,
                "cost": usd,
                "currency": PROVIDER_CURRENCY,
                "cost_usd": usd,
                "cost_note": f"{why}: amount in {PROVIDER_CURRENCY}",
            }
            continue
        converted = price.cost(row["input_at_rate"], row["output_at_rate"]).quantize(PLACES)
        if row["lowest"] == row["highest"]:  # every draft's unit at one rate: that rate, as it was kept
            rate, source = row["lowest"], row["rate_source"]
        else:
            rate = (converted / usd).quantize(RATE_PLACES) if usd else row["highest"]
            source = WEIGHTED_RATE
        costs[row["item_id"]] = {
            "cost": converted,
            "currency": currency,
            "cost_usd": usd,
            "rate": rate,
            "rate_date": row["rate_date"].isoformat(),
            "rate_source": source,
            "cost_note": "",
        }
    return costs


# --- the formats ---------------------------------------------------------------------------

# Text that UTF-8 cannot carry (a lone surrogate) and NUL, which stops many CSV readers.
UNWRITABLE_IN_CSV = re.compile("[\x00\ud800-\udfff]")


def csv_text(value: object) -> object:
    if isinstance(value, str):
        value = UNWRITABLE_IN_CSV.sub("\ufffd", value)
    return csv_cell(value)


def csv_stream(chunks: Iterable[list[dict]]) -> Iterator[bytes]:
    """UTF-8 with a byte-order mark, every cell quoted, as the audit's CSV is; a cell a spreadsheet
    would run as a formula starts with `'`."""
    writer = csv.writer(Echo(), quoting=csv.QUOTE_ALL)
    yield (BYTE_ORDER_MARK + writer.writerow(COLUMNS)).encode()
    for rows in chunks:
        yield "".join(writer.writerow([csv_text(row[c]) for c in COLUMNS]) for row in rows).encode()


def jsonl_line(row: dict) -> str:
    # Non-ASCII text as it is; a line holding a lone surrogate (which UTF-8 cannot carry) is written
    # with JSON's escapes instead, so it reads back as the same string.
    line = json.dumps(row, ensure_ascii=False, cls=DjangoJSONEncoder)
    try:
        line.encode()
    except UnicodeEncodeError:
        line = json.dumps(row, cls=DjangoJSONEncoder)
    return line + "\n"


def jsonl_stream(chunks: Iterable[list[dict]]) -> Iterator[bytes]:
    """One JSON object a line, with the CSV's columns as keys; amounts as text, to keep their digits."""
    for rows in chunks:
        yield "".join(jsonl_line(row) for row in rows).encode()


WRITERS = {"csv": csv_stream, "jsonl": jsonl_stream}


def file_name(job: Job, format: str) -> str:
    """Made from the job's reference, which may hold any character: only letters, digits, `.`,
    `_` and `-` are kept, so no browser or shell meets a quote, a slash or a line break."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", job.reference).strip("._-")[:80]
    return f"job-{job.pk}-{readable}.{format}" if readable else f"job-{job.pk}.{format}"


def requested_format(request: HttpRequest) -> str | None:
    """`format` from the query (CSV when absent); None when it names anything else."""
    values = request.GET.getlist("format") or ["csv"]
    return values[0] if len(values) == 1 and values[0] in FORMATS else None


BAD_FORMAT = "format must be csv or jsonl"


def export_response(job: Job, format: str) -> StreamingHttpResponse:
    return StreamingHttpResponse(
        WRITERS[format](export_chunks(job)),
        content_type=CONTENT_TYPES[format],
        headers={
            "Content-Disposition": content_disposition_header(True, file_name(job, format)),
            "Cache-Control": "private, no-store",
        },
    )


# --- the views -----------------------------------------------------------------------------


@endpoint(GET=VIEWERS)
def api_job_export(request: HttpRequest, job_id: int) -> HttpResponse:
    job = Job.objects.filter(pk=job_id).only("pk", "reference", "provider", "model").first()
    if job is None:
        return not_found(request, "No job")
    format = requested_format(request)
    if format is None:
        raise ApiError(400, "invalid", BAD_FORMAT, {"format": BAD_FORMAT})
    return export_response(job, format)


@require_GET
@login_required
@role_required(*VIEWERS)
def job_export(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(Job.objects.only("pk", "reference", "provider", "model"), pk=job_id)
    format = requested_format(request)
    if format is None:
        return HttpResponse(f"Nothing was exported: {BAD_FORMAT}.\n", status=400, content_type="text/plain")
    return export_response(job, format)
