"""A job's outcome as a file (the job page's export buttons, and SPEC §6
`GET /api/jobs/{id}/export?format=csv|jsonl`: review/api/exports.py): one row an item, in item id
order, with what became of it: its state, the text approved for it and by whom, what its drafts cost,
and what the destination last said.

The rows are read a chunk of items at a time, by key (`item_job`: the job's items in id order), with
four queries a chunk whatever its size: the items, the approvals that stand, their last destination
attempts, and their drafts' tokens and rates summed. Each chunk is written out before the next is
read, so memory stays flat at a million items and the first bytes leave at once. A chunk is read as
it is then: an export of a job that is still working shows each item as it was when its chunk was
read.

An item's cost is its share of the job's cost (`pricing.job_cost`: what its settled units kept, plus
its drafts not settled yet at today's rate), in proportion to what its drafts (a retry's included)
cost at the job's batch price, split by `apportion.split_exactly` so that the rows add up to the job's
total exactly, and `cost_usd` to its total at the provider. The split is made in two steps, so memory
stays flat: before the first chunk, one grouped query reads the job's items in id order with their
drafts' tokens, and keeps only where each chunk starts and what its drafts cost (a few numbers per
2,000 items); the total is split among the chunks, then each chunk's part among its items as the
chunk is written. Each row is its exact share to within two millionths. `rate`, `rate_date` and
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
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.contrib.auth.decorators import login_required
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Count, DecimalField, ExpressionWrapper, F, Max, Min, Q, Sum
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_GET

from ledger.models import Approval, DestinationAttempt, GeneratedVersion, Item, Job
from ledger.money.apportion import split_exactly
from ledger.money.currency import PROVIDER_CURRENCY, business_currency
from ledger.money.pricing import job_cost, price_for, unknown_price
from ledger.states import ItemState

from .audit import BYTE_ORDER_MARK, FORMULA_STARTS, Echo
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
LABELS = dict(ItemState.choices)
_json_encoder = DjangoJSONEncoder()


def utc_text(moment: datetime | None) -> str | None:
    """ISO 8601 in UTC, as the API writes times (`2026-12-06T02:38:31.123Z`)."""
    return None if moment is None else _json_encoder.default(moment.astimezone(UTC))


# --- the rows ------------------------------------------------------------------------------


def export_chunks(job: Job) -> Iterator[list[tuple]]:
    """The job's items as rows (values in the order of `COLUMNS`), in id order, a chunk at a time."""
    shares = ChunkShares(job)
    for number, first_id in enumerate(shares.first_ids):
        items = Item.objects.filter(job=job, pk__gte=first_id)
        if number + 1 < len(shares.first_ids):
            items = items.filter(pk__lt=shares.first_ids[number + 1])
        yield rows_of(
            job,
            list(
                items.order_by("pk").values_list(
                    "pk", "product__sku", "source_revision__number", "state", "reason", "approved_version_id"
                )
            ),
            shares.chunk(number),
        )


@dataclass(frozen=True)
class ChunkCost:
    """A chunk's part of the job's cost and of its cost at the provider (None without a price), to be
    split among its items; and the job's cost."""

    amount: Decimal | None
    amount_usd: Decimal | None
    job_cost: dict


class ChunkShares:
    """Where each chunk of CHUNK_ITEMS items starts, and its part of the job's cost: the job's total
    split among the chunks in proportion to what their drafts cost at the batch price (all weights
    nought: to the chunks with drafts alike). One grouped query, read as it streams."""

    def __init__(self, job: Job):
        self.cost = job_cost(job)
        self.first_ids: list[int] = []
        tokens: list[list[int]] = []  # a chunk's input tokens, output tokens and items with drafts
        rows = (
            Item.objects.filter(job=job)
            .order_by("pk")
            .values("pk")
            .annotate(tokens_in=Sum("versions__input_tokens"), tokens_out=Sum("versions__output_tokens"))
            .values_list("pk", "tokens_in", "tokens_out")
        )
        for n, (item_id, tokens_in, tokens_out) in enumerate(rows.iterator(chunk_size=CHUNK_ITEMS)):
            if n % CHUNK_ITEMS == 0:
                self.first_ids.append(item_id)
                tokens.append([0, 0, 0])
            if tokens_in is not None:
                tokens[-1][0] += tokens_in
                tokens[-1][1] += tokens_out
                tokens[-1][2] += 1
        self.amounts = self.amounts_usd = [None] * len(self.first_ids)
        price = price_for(job.provider, job.model)
        if price is not None and self.cost["total"] is not None and self.first_ids:
            weights = [price.cost(tokens_in, tokens_out) for tokens_in, tokens_out, _ in tokens]
            if not any(weights):
                weights = [Decimal(drafted) for _, _, drafted in tokens]
            self.amounts = split_exactly(self.cost["total"], weights)
            self.amounts_usd = split_exactly(self.cost["provider_currency"]["total"], weights)

    def chunk(self, number: int) -> ChunkCost:
        return ChunkCost(self.amounts[number], self.amounts_usd[number], self.cost)


def rows_of(job: Job, items: list[tuple], chunk: ChunkCost) -> list[tuple]:
    # The chunk's rows of the other tables are found by the range of its item ids (each table's item
    # index), not by a list of thousands of ids: such a list took longer to send than the rows did.
    # Rows of another job's items in that range are read and left unused.
    ids = (items[0][0], items[-1][0])
    approvals = {
        approval[0]: approval[1:]
        for approval in Approval.objects.filter(item_id__gte=ids[0], item_id__lte=ids[1])
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
    costs = drafts_cost(job, items, chunk)
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


def drafts_cost(job: Job, items: list[tuple], chunk: ChunkCost) -> dict[int, tuple]:
    """The cost columns of the chunk's items that have drafts, from one grouped query over their id
    range: each item's share of the chunk's part of the job's cost (`ChunkShares`), in proportion to
    what its drafts cost at the batch price, and the rate its drafts' units kept. Amounts as text, to
    keep their digits."""
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
    cost = chunk.job_cost
    if not cost["price_known"]:
        unpriced = (None,) * 6 + (unknown_price(job.provider, job.model),)
        return {row[0]: unpriced for row in sums}
    ours = {item[0] for item in items}  # the range may hold other jobs' items
    sums = [row for row in sums if row[0] in ours]
    price = price_for(job.provider, job.model)
    weights = [price.cost(tokens_in, tokens_out) for _, _, tokens_in, tokens_out, *_ in sums]
    amounts = split_exactly(chunk.amount, weights) if chunk.amount is not None else [None] * len(sums)
    amounts_usd = split_exactly(chunk.amount_usd, weights) if chunk.amount_usd is not None else amounts
    in_usd = cost["currency"] == PROVIDER_CURRENCY and currency != PROVIDER_CURRENCY
    costs = {}
    for row, amount, amount_usd in zip(sums, amounts, amounts_usd, strict=True):
        item_id, drafts, _, _, unsettled_drafts, kept_drafts, *tokens, lowest, highest, day, source = row
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


def export_response(job: Job, format: str) -> StreamingHttpResponse:
    return StreamingHttpResponse(
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
    return export_response(job, format)
