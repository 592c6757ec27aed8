"""A job's outcome as a file (the job page's export buttons, and SPEC §6
`GET /api/jobs/{id}/export?format=csv|jsonl`: review/api/exports.py): one row an item, in item id
order, with what became of it: its state, the text approved for it and by whom, what its drafts cost,
and what the destination last said.

The rows are read a chunk of items at a time, by key (`item_job`: the job's items in id order, the
next chunk after the last id written), with four queries a chunk whatever its size: the items, the
approvals that stand, their last destination attempts, and their drafts' tokens and rates summed.
Each chunk is written out before the next is read, so memory stays flat at a million items and the
first bytes leave at once: nothing is read ahead. The job's cost and every chunk are read in one
snapshot (PostgreSQL's REPEATABLE READ), so an export of a job that is still working shows the job
as it was when the export began.

An item's cost is its share of the job's cost (`pricing.job_cost`: what its settled units kept, plus
its drafts not settled yet at today's rate), in proportion to what its drafts (a retry's included)
cost at the job's batch price, and `cost_usd` its share of the job's total at the provider. The
shares are rounded cumulatively as the rows are written (`CostShares`), so the rows add up to the
job's totals exactly and each is its exact share to within a millionth. `rate`, `rate_date` and
`rate_source` say what its drafts' units kept; `cost_note` says when a draft has not settled yet, or
why the job's cost is in USD.

Model output is untrusted: in CSV a cell that a spreadsheet would run as a formula starts with `'`
(`review.audit.FORMULA_STARTS`), and text that UTF-8 cannot carry becomes U+FFFD; JSONL carries every
string as it is, escaped by JSON where it must be.
"""

import csv
import json
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal

from django.contrib.auth.decorators import login_required
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.models import Count, DecimalField, ExpressionWrapper, F, Max, Min, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_GET

from ledger.models import Approval, DestinationAttempt, Event, GeneratedVersion, Item, Job
from ledger.money.currency import PLACES, PROVIDER_CURRENCY, business_currency
from ledger.money.pricing import job_cost, price_for, unknown_price
from ledger.states import ItemState

from .audit import BYTE_ORDER_MARK, FORMULA_STARTS, Echo
from .permissions import VIEWERS, role_required
from .streaming import streamed_file

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
    "reason_code",
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
LABELS = dict(ItemState.choices)
_json_encoder = DjangoJSONEncoder()


def utc_text(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC, as the API writes times (`2026-12-06T02:38:31.123Z`)."""
    return None if moment is None else _json_encoder.default(moment.astimezone(UTC))


# --- the rows ------------------------------------------------------------------------------


def export_chunks(job: Job) -> Iterator[list[tuple]]:
    """The job's items as rows (values in the order of `COLUMNS`), in id order, a chunk at a time,
    all read in one snapshot: the job's cost and every chunk as they stood when the export began."""
    with snapshot():
        shares = CostShares(job)
        after = 0
        while True:
            items = list(
                Item.objects.filter(job=job, pk__gt=after)
                .order_by("pk")
                .values_list(
                    "pk", "product__sku", "source_revision__number", "state", "reason", "approved_version_id"
                )[:CHUNK_ITEMS]
            )
            if not items:
                return
            yield rows_of(job, items, shares)
            if len(items) < CHUNK_ITEMS:
                return
            after = items[-1][0]


@contextmanager
def snapshot() -> Iterator[None]:
    """One transaction whose reads all see the database as it was at its first (PostgreSQL's
    REPEATABLE READ, read only): the job's totals, read from its tallies first, then agree with the
    drafts its chunks read, however long the export takes and whatever is drafted meanwhile. Within
    a transaction already open (a test's), that transaction's view is the one read."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield


class CostShares:
    """Each item's share of the job's cost (`pricing.job_cost`) and of its cost at the provider, in
    proportion to what its drafts cost at the batch price (its weight), handed out in id order as the
    rows are written, with nothing read ahead. The job's weight W is known before the first row: what
    all its drafts cost at the batch price, from its tallies (the price is linear in tokens, so that is
    the sum of its items' weights, apportioned drafts included). The rows are rounded cumulatively:
    with C the running sum of the weights up to and including an item, its amount is
    Q(T × C / W) − Q(T × C' / W), C' the sum before it and Q rounding to the ledger's places. The
    amounts telescope to Q(T) = T, the total, exactly, and each is its exact share to within a
    millionth. All weights nought: each item with drafts weighs one (counted up front then)."""

    def __init__(self, job: Job):
        self.cost = job_cost(job)
        self.price = price_for(job.provider, job.model)
        self.totals = (None, None)
        self.weight, self.whole, self.alike = Decimal(0), Decimal(0), False
        if self.price is not None and self.cost["total"] is not None:
            self.totals = (self.cost["total"], self.cost["provider_currency"]["total"])
            self.whole = self.price.cost(self.cost["input_tokens"], self.cost["output_tokens"])
            self.alike = not self.whole
            if self.alike:
                self.whole = Decimal(
                    GeneratedVersion.objects.filter(item__job=job).values("item_id").distinct().count()
                )

    def next(self, tokens_in: int, tokens_out: int) -> tuple[Decimal | None, Decimal | None]:
        """The next item's amount and amount at the provider (None without a price or a total)."""
        if self.totals[0] is None:
            return self.totals
        before = self.weight
        self.weight += Decimal(1) if self.alike else self.price.cost(tokens_in, tokens_out)
        return tuple(self.point(total, self.weight) - self.point(total, before) for total in self.totals)

    def point(self, total: Decimal, weight: Decimal) -> Decimal:
        """Q(T × C / W): the part of `total` the items so far have had, rounded."""
        if weight == self.whole:
            return total
        return (total * weight / self.whole).quantize(PLACES)


def rows_of(job: Job, items: list[tuple], shares: CostShares) -> list[tuple]:
    # The chunk's rows of the other tables are found by the range of its item ids (each table's item
    # index), not by a list of thousands of ids: such a list took longer to send than the rows did.
    # Rows of another job's items in that range are read and left unused.
    ids = (items[0][0], items[-1][0])
    approvals = {
        approval[0]: approval[1:]
        for approval in Approval.objects.standing()
        .filter(item_id__gte=ids[0], item_id__lte=ids[1])
        .order_by()
        .values_list(
            "version_id", "version__number", "final_content", "edited", "approved_by__username", "approved_at"
        )
    }
    last_attempts = {
        attempt[0]: attempt[1:]
        for attempt in DestinationAttempt.objects.filter(item_id__gte=ids[0], item_id__lte=ids[1])
        .order_by("item_id", "started_at", "pk")  # each item's last attempt is the one kept
        .values_list("item_id", "destination", "outcome", "started_at", "finished_at")
    }
    costs = drafts_cost(job, items, shares)
    # A rejected item's reason code: the reviewer's, from their rejection (its prompt version's list).
    rejected = [item[0] for item in items if item[3] == ItemState.REJECTED]
    codes = (
        dict(
            Event.objects.rejections()
            .filter(item_id__in=rejected)
            .order_by("item_id", "id")
            .values_list("item_id", "data__reason_code")
        )
        if rejected
        else {}
    )
    rows = []
    for item_id, sku, revision, state, reason, approved_version_id in items:
        number, text, edited, reviewer, approved_at = approvals.get(approved_version_id, NO_APPROVAL)
        destination, outcome, started_at, finished_at = last_attempts.get(item_id, NO_ATTEMPT)
        rows.append(
            (
                item_id,
                sku,
                revision,
                state,
                LABELS[state],
                reason,
                codes.get(item_id) or "",
                number,
                text,
                edited,
                reviewer,
                utc_text(approved_at),
                *costs.get(item_id, NO_COST),
                destination,
                outcome,
                utc_text(finished_at or started_at),
                state == ItemState.APPLIED,
            )
        )
    return rows


NO_APPROVAL = (None,) * 5
NO_ATTEMPT = (None,) * 4
# cost, currency, cost_usd, rate, rate_date, rate_source, cost_note
NO_COST = (None,) * 7


def at_rate(tokens: str) -> ExpressionWrapper:
    return ExpressionWrapper(
        F(tokens) * F("submission__charge__rate"), output_field=DecimalField(max_digits=30, decimal_places=8)
    )


def drafts_cost(job: Job, items: list[tuple], shares: CostShares) -> dict[int, tuple]:
    """The cost columns of the chunk's items that have drafts, from one grouped query over their id
    range: each item's share of the job's cost (`CostShares`, handed out in id order), and the rate its
    drafts' units kept. Amounts as text, to keep their digits."""
    currency = business_currency()
    kept = Q(
        submission__charge__settled_at__isnull=False,
        submission__charge__rate__isnull=False,
        submission__charge__currency=currency,
    )
    unsettled = Q(submission__charge__isnull=True) | Q(submission__charge__settled_at__isnull=True)
    sums = (
        GeneratedVersion.objects.filter(item_id__gte=items[0][0], item_id__lte=items[-1][0])
        .order_by("item_id")
        .values("item_id")
        .annotate(
            drafts=Count("pk"),
            tokens_in=Sum("input_tokens"),
            tokens_out=Sum("output_tokens"),
            unsettled=Count("pk", filter=unsettled),
            kept=Count("pk", filter=kept),
            kept_in=Sum("input_tokens", filter=kept),
            kept_out=Sum("output_tokens", filter=kept),
            input_at_rate=Sum(at_rate("input_tokens"), filter=kept),
            output_at_rate=Sum(at_rate("output_tokens"), filter=kept),
            lowest=Min("submission__charge__rate", filter=kept),
            highest=Max("submission__charge__rate", filter=kept),
            rate_date=Max("submission__charge__rate_date", filter=kept),
            rate_source=Max("submission__charge__rate_source", filter=kept),
        )
        .values_list(
            "item_id",
            "drafts",
            "tokens_in",
            "tokens_out",
            "unsettled",
            "kept",
            "kept_in",
            "kept_out",
            "input_at_rate",
            "output_at_rate",
            "lowest",
            "highest",
            "rate_date",
            "rate_source",
        )
    )
    cost = shares.cost
    if not cost["price_known"]:
        unpriced = (None,) * 6 + (unknown_price(job.provider, job.model),)
        return {row[0]: unpriced for row in sums}
    ours = {item[0] for item in items}  # the range may hold other jobs' items
    sums = [row for row in sums if row[0] in ours]
    price = shares.price
    in_usd = cost["currency"] == PROVIDER_CURRENCY and currency != PROVIDER_CURRENCY
    costs = {}
    for row in sums:
        (
            item_id,
            drafts,
            tokens_in,
            tokens_out,
            unsettled_drafts,
            kept_drafts,
            *tokens,
            lowest,
            highest,
            day,
            source,
        ) = row
        if unsettled_drafts:
            note = "not settled yet: amount in USD" if in_usd else "not settled yet: at today's rate"
        elif kept_drafts < drafts:
            note = f"no rate to {currency} was in force: amount in USD"
        else:
            note = "the job's cost is in USD: amount in USD" if in_usd else ""
        if not kept_drafts:
            rate = day = source = None
        elif lowest == highest:  # every kept draft's unit at one rate: that rate, as it was kept
            rate = lowest
        else:
            kept_in, kept_out, input_at_rate, output_at_rate = tokens
            usd = price.cost(kept_in, kept_out)
            at_rates = price.cost(input_at_rate, output_at_rate)
            rate, source = (at_rates / usd).quantize(RATE_PLACES) if usd else highest, WEIGHTED_RATE
        amount, amount_usd = shares.next(tokens_in, tokens_out)
        costs[item_id] = (
            None if amount is None else str(amount),
            cost["currency"],
            None if amount_usd is None else str(amount_usd),
            None if rate is None else str(rate),
            None if day is None else day.isoformat(),
            source,
            note,
        )
    return costs


# --- the formats ---------------------------------------------------------------------------

# Text that UTF-8 cannot carry (a lone surrogate) and NUL, which stops many CSV readers.
UNWRITABLE_IN_CSV = re.compile("[\x00\ud800-\udfff]")


def csv_text(text: str) -> str:
    if "\x00" in text or not text.isascii():  # the test is quicker than the search, which is rarely needed
        text = UNWRITABLE_IN_CSV.sub("\ufffd", text)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def csv_values(row: tuple) -> list:
    # Checked by type inline: a million rows of 22 cells make a function call per cell count.
    return [
        csv_text(value)
        if value.__class__ is str
        else ("yes" if value else "no")
        if value.__class__ is bool
        else value
        for value in row
    ]


def csv_stream(chunks: Iterable[list[tuple]]) -> Iterator[bytes]:
    """UTF-8 with a byte-order mark, every cell quoted, as the audit's CSV is; a cell a spreadsheet
    would run as a formula starts with `'`."""
    writer = csv.writer(Echo(), quoting=csv.QUOTE_ALL)
    yield (BYTE_ORDER_MARK + writer.writerow(COLUMNS)).encode()
    for rows in chunks:
        yield "".join(writer.writerow(csv_values(row)) for row in rows).encode()


def jsonl_line(row: tuple) -> str:
    # Non-ASCII text as it is; a line holding a lone surrogate (which UTF-8 cannot carry) is written
    # with JSON's escapes instead, so it reads back as the same string.
    values = dict(zip(COLUMNS, row, strict=True))
    line = json.dumps(values, ensure_ascii=False)
    try:
        line.encode()
    except UnicodeEncodeError:
        line = json.dumps(values)
    return line + "\n"


def jsonl_stream(chunks: Iterable[list[tuple]]) -> Iterator[bytes]:
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


def export_response(request: HttpRequest, job: Job, format: str) -> HttpResponse:
    return streamed_file(
        request,
        WRITERS[format](export_chunks(job)),
        content_type=CONTENT_TYPES[format],
        headers={
            "Content-Disposition": content_disposition_header(True, file_name(job, format)),
            "Cache-Control": "private, no-store",
        },
    )


# --- the screen ------------------------------------------------------------------------------


@require_GET
@login_required
@role_required(*VIEWERS)
def job_export(request: HttpRequest, job_id: int) -> HttpResponse:
    job = get_object_or_404(Job.objects.only("pk", "reference", "provider", "model"), pk=job_id)
    format = requested_format(request)
    if format is None:
        return HttpResponse(f"Nothing was exported: {BAD_FORMAT}.\n", status=400, content_type="text/plain")
    return export_response(request, job, format)
