"""A job's outcome exported (the job page's buttons; the API's `GET /api/jobs/{id}/export` is
tests/api/test_job_export.py): a row an item with its state, approved text, reviewer, cost and
destination outcome, as CSV and JSONL, streamed a chunk of items at a time, with formulas neutralised
in CSV and every string kept in JSONL."""

import json
import threading
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from ledger.models import (
    DestinationAttempt,
    GeneratedVersion,
    Item,
    Job,
    Submission,
    SubmissionItem,
    UnitCharge,
)
from ledger.money import budgets
from ledger.money.currency import forget_entered_rates
from ledger.money.pricing import job_cost, price_for
from ledger.states import ItemState
from review.job_export import COLUMNS, csv_stream, file_name, jsonl_stream
from tests.exported_jobs import (
    EDITED,
    FORMULA_REASON,
    RATE,
    SOURCE,
    csv_rows,
    jsonl_rows,
    streamed,
)
from tests.factories import ItemFactory, JobFactory, add_version

pytestmark = pytest.mark.django_db


def export(client, job, format: str) -> bytes:
    return streamed(client.get(reverse("job_export", args=[job.pk]), {"format": format}))


def test_each_column_of_items_in_several_states_as_jsonl(client, owner, worked_job):
    job, items = worked_job
    client.force_login(owner)
    rows = jsonl_rows(export(client, job, "jsonl"))

    assert [row["item_id"] for row in rows] == [item.pk for item in items]
    assert all(list(row) == list(COLUMNS) for row in rows)
    edited, applied, rejected, waiting, unsent, _ = rows
    assert [row["state"] for row in rows] == [
        "approved",
        "applied",
        "rejected",
        "awaiting_review",
        "prepared",
        "prepared",
    ]
    assert edited["sku"] == items[0].product.sku and edited["source_revision"] == 1
    assert edited["label"] == ItemState.APPROVED.label
    # The approval that stands: its final (edited) text, version number, reviewer and time in UTC.
    assert edited["approved_text"] == EDITED and edited["edited"] is True
    assert edited["approved_version"] == 1 and edited["reviewer"] == owner.username
    approval = items[0].approvals.get()
    assert edited["approved_at"] == approval.approved_at.isoformat(timespec="milliseconds").replace(
        "+00:00", "Z"
    )
    assert edited["destination_outcome"] is None and edited["published"] is False
    # Approved as it was, and applied: the draft's own text, published by the last attempt.
    draft = items[1].versions.get()
    assert applied["approved_text"] == draft.content and applied["edited"] is False
    assert applied["destination"] == "catalogue" and applied["destination_outcome"] == "applied"
    attempt = items[1].destination_attempts.get()
    assert applied["destination_at"] == attempt.finished_at.isoformat(timespec="milliseconds").replace(
        "+00:00", "Z"
    )
    assert applied["published"] is True
    # Rejected: the reviewer's reason, no approval; JSONL keeps the text as it is.
    assert rejected["reason"] == FORMULA_REASON
    assert rejected["approved_text"] is None and rejected["reviewer"] is None
    assert waiting["approved_text"] is None
    # Cost: the item's share of the job's cost, in proportion to its draft's tokens at the batch price:
    # within a millionth of those tokens in pounds at the rate its unit was settled at.
    price = price_for(job.provider, job.model)
    millionth = Decimal("0.000001")
    for row, item in zip(rows[:4], items[:4], strict=True):
        version = item.versions.get()
        exact = price.cost(version.input_tokens, version.output_tokens)
        assert abs(Decimal(row["cost_usd"]) - exact) < millionth and Decimal(row["cost_usd"]) > 0
        assert abs(Decimal(row["cost"]) - exact * RATE) < millionth
        assert (row["currency"], Decimal(row["rate"]), row["rate_date"], row["rate_source"]) == (
            "GBP",
            RATE,
            "2020-01-01",
            SOURCE,
        )
        assert row["cost_note"] == ""
    # No draft yet: no cost, no approval, no destination.
    assert {key: unsent[key] for key in COLUMNS if key not in ("item_id", "sku", "state", "label")} == {
        "source_revision": 1,
        "reason": "",
        "reason_code": "",
        "approved_version": None,
        "approved_text": None,
        "edited": None,
        "reviewer": None,
        "approved_at": None,
        "cost": None,
        "currency": None,
        "cost_usd": None,
        "rate": None,
        "rate_date": None,
        "rate_source": None,
        "cost_note": None,
        "destination": None,
        "destination_outcome": None,
        "destination_at": None,
        "published": False,
    }


def test_the_csv_says_the_same_with_a_byte_order_mark_and_formulas_neutralised(client, owner, worked_job):
    job, items = worked_job
    client.force_login(owner)
    body = export(client, job, "csv")
    rows = csv_rows(body)
    as_json = jsonl_rows(export(client, job, "jsonl"))

    assert list(rows[0]) == list(COLUMNS)
    assert len(rows) == len(items)
    # The reviewer's reason starts with "=": a spreadsheet would run it; the CSV starts it with "'".
    assert rows[2]["reason"] == "'" + FORMULA_REASON
    assert rows[0]["approved_text"] == EDITED
    assert (rows[0]["edited"], rows[1]["published"], rows[4]["published"]) == ("yes", "yes", "no")
    for row, same in zip(rows, as_json, strict=True):
        assert row["item_id"] == str(same["item_id"]) and row["sku"] == same["sku"]
        assert row["cost"] == (same["cost"] or "") and row["approved_at"] == (same["approved_at"] or "")
    # Every cell quoted, as the audit's CSV.
    assert body.decode("utf-8-sig").splitlines()[1].startswith(f'"{items[0].pk}","')


@pytest.mark.parametrize("chunk_items", [2000, 3])
def test_the_rows_costs_add_up_to_the_jobs_cost_exactly(
    client, owner, settings, tmp_path, monkeypatch, chunk_items
):
    monkeypatch.setattr("review.job_export.CHUNK_ITEMS", chunk_items)  # one chunk, or its part of four
    # Issue 27: each row rounded on its own, the rows of a job came to 0.000552 against a total of
    # 0.000549. Prices that round at the sixth place, drafts of different sizes, units settled at
    # two rates and one draft not settled yet: the column still adds up to the job's total.
    prices = tmp_path / "prices.json"
    prices.write_text(
        json.dumps(
            {
                "openai": {
                    "models": {"gpt-4o-mini": {"input_per_million": "0.37", "output_per_million": "1.13"}}
                }
            }
        )
    )
    settings.BATCHDESK_PRICE_FILE, settings.BATCHDESK_CURRENCY = str(prices), "GBP"
    job = JobFactory(owner=owner)
    for n in range(9):
        item = ItemFactory(job=job, awaiting_review=True)
        version = add_version(item)
        GeneratedVersion.objects.filter(pk=version.pk).update(
            input_tokens=101 + 7 * n, output_tokens=33 + 5 * n
        )
        if n < 8:
            rates = tmp_path / f"rates-{n % 2}.json"
            rates.write_text(
                json.dumps({"source": "bank", "per_usd": {"2020-01-01": ("0.7913", "0.80017")[n % 2]}})
            )
            settings.BATCHDESK_FX_FILE = str(rates)
            settled_unit(job, item, version, f"bd_unit_{n}")
    ItemFactory(job=job)  # no draft: no cost
    cost = job_cost(job)
    client.force_login(owner)
    for format, read in (("csv", csv_rows), ("jsonl", jsonl_rows)):
        rows = read(export(client, job, format))
        assert sum(Decimal(row["cost"]) for row in rows if row["cost"]) == cost["total"] > 0
        assert (
            sum(Decimal(row["cost_usd"]) for row in rows if row["cost_usd"])
            == cost["provider_currency"]["total"]
        )
        assert {row["currency"] for row in rows if row["cost"]} == {"GBP"}
    notes = [row["cost_note"] for row in rows]
    assert notes.count("not settled yet: at today's rate") == 1 and notes.count("") == 8


def test_thirds_of_a_millionth_are_rounded_as_they_run_and_still_add_up(
    client, owner, settings, tmp_path, monkeypatch
):
    # Three drafts of 0.0000015 each: the job's total rounds to 0.000004. Each row rounded on its
    # own makes 0.000002 three times (or a third of the total, 0.000001, three times): neither is the
    # total. Rounded as the rows run, Q(T × C / W) − Q(T × C' / W), with a chunk's edge between them,
    # they are 1, 2 and 1 millionths: each within a millionth of its third, and together the total.
    monkeypatch.setattr("review.job_export.CHUNK_ITEMS", 2)
    prices = tmp_path / "prices.json"
    prices.write_text(
        json.dumps(
            {"openai": {"models": {"gpt-4o-mini": {"input_per_million": "1", "output_per_million": "1"}}}}
        )
    )
    settings.BATCHDESK_PRICE_FILE = str(prices)
    job = JobFactory(owner=owner)
    for _ in range(3):
        add_version(ItemFactory(job=job, awaiting_review=True), input_tokens=2, output_tokens=1)
    cost = job_cost(job)
    assert cost["total"] == cost["provider_currency"]["total"] == Decimal("0.000004")
    millionth = Decimal("0.000001")
    assert 3 * Decimal("0.0000015").quantize(millionth) != cost["total"]
    assert 3 * (cost["total"] / 3).quantize(millionth) != cost["total"]
    client.force_login(owner)
    rows = jsonl_rows(export(client, job, "jsonl"))
    assert [Decimal(row["cost"]) for row in rows] == [millionth, 2 * millionth, millionth]
    assert [Decimal(row["cost_usd"]) for row in rows] == [millionth, 2 * millionth, millionth]
    assert all(abs(Decimal(row["cost"]) - cost["total"] / 3) < millionth for row in rows)


def test_the_first_rows_stream_before_anything_else_of_the_job_is_read(client, owner, monkeypatch):
    # Issue 27: a grouped pass over every item and draft of the job ran before the first byte left.
    # While the first chunk is read and written, no query reads the job's items but that chunk's,
    # and none groups them: what the rows' costs add up to comes from the job's tallies.
    monkeypatch.setattr("review.job_export.CHUNK_ITEMS", 3)
    job = JobFactory(owner=owner)
    items = [ItemFactory(job=job, awaiting_review=True) for _ in range(7)]
    for item in items:
        add_version(item)
    client.force_login(owner)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse("job_export", args=[job.pk]), {"format": "jsonl"})
        first = next(iter(response.streaming_content))
    response.close()
    assert [row["item_id"] for row in jsonl_rows(first)] == [item.pk for item in items[:3]]
    reading_items = [query["sql"] for query in queries if 'FROM "ledger_item"' in query["sql"]]
    assert reading_items and all("GROUP BY" not in sql and "LIMIT 3" in sql for sql in reading_items)
    drafts = [query["sql"] for query in queries if 'FROM "ledger_generatedversion"' in query["sql"]]
    assert len(drafts) == 1 and '"item_id" <= ' in drafts[0]  # the chunk's, by its ids


@pytest.mark.postgresql_only  # a snapshot of the job as the export began: SQLite locks the table instead
@pytest.mark.django_db(transaction=True)
def test_a_draft_recorded_while_the_job_streams_is_left_to_the_next_export(client, owner, monkeypatch):
    # The rows' costs are shares of the job's total read before the first row; a draft another
    # worker records after the first chunk left would add a weight the total never had. The export
    # reads in one snapshot: it shows the job as it was when it began, and still adds up.
    monkeypatch.setattr("review.job_export.CHUNK_ITEMS", 2)
    job = JobFactory(owner=owner)
    items = [ItemFactory(job=job, awaiting_review=True) for _ in range(4)]
    for item in items[:3]:
        add_version(item)
    before = job_cost(job)
    client.force_login(owner)
    response = client.get(reverse("job_export", args=[job.pk]), {"format": "jsonl"})
    chunks = iter(response.streaming_content)
    first = next(chunks)

    def another_worker():
        add_version(items[3], input_tokens=5000, output_tokens=5000)
        connection.close()

    worker = threading.Thread(target=another_worker)
    worker.start()
    worker.join()
    rows = jsonl_rows(first + b"".join(chunks))
    response.close()
    assert job_cost(job)["total"] > before["total"]  # the draft was recorded
    assert [row["cost"] for row in rows][3] is None
    assert sum(Decimal(row["cost"]) for row in rows if row["cost"]) == before["total"] > 0
    assert (
        sum(Decimal(row["cost_usd"]) for row in rows if row["cost_usd"])
        == (before["provider_currency"]["total"])
    )


def test_a_draft_whose_unit_is_not_settled_is_costed_in_dollars_and_says_so(client, owner):
    job = JobFactory(owner=owner)
    add_version(ItemFactory(job=job, state=ItemState.VALIDATION_FAILED), valid=False, reasons=["too short"])
    client.force_login(owner)
    [row] = jsonl_rows(export(client, job, "jsonl"))
    assert row["state"] == "validation_failed"
    assert row["currency"] == "USD" and row["cost"] == row["cost_usd"] and Decimal(row["cost"]) > 0
    assert row["rate"] is None and row["cost_note"] == "not settled yet: amount in USD"


def settled_unit(job, item, version, key: str) -> UnitCharge:
    """The version's unit, reserved, then settled by the ledger at the rate in force now."""
    unit = Submission.objects.create(job=job, provider=job.provider, model=job.model, intent_key=key)
    charge = UnitCharge.objects.create(job=job, submission=unit, currency="GBP", reserved_usd=Decimal(1))
    SubmissionItem.objects.create(submission=unit, item=item, custom_id=version.custom_id)
    GeneratedVersion.objects.filter(pk=version.pk).update(submission=unit)
    budgets.settle(unit)
    return UnitCharge.objects.get(pk=charge.pk)


def test_drafts_of_units_settled_at_two_rates_cost_what_the_units_kept(client, owner, settings, tmp_path):
    prices = tmp_path / "prices.json"
    prices.write_text(
        json.dumps(
            {
                "openai": {
                    "models": {"gpt-4o-mini": {"input_per_million": "1000", "output_per_million": "4000"}}
                }
            }
        )
    )
    settings.BATCHDESK_PRICE_FILE = str(prices)
    settings.BATCHDESK_CURRENCY = "GBP"
    job = JobFactory(owner=owner)
    item = ItemFactory(job=job, awaiting_review=True)
    first, second = add_version(item), add_version(item)  # a draft, then its retry's
    for name, day, rate in (("a", "2020-01-01", "0.7890"), ("b", "2021-06-01", "0.8000")):
        rates = tmp_path / f"rates-{name}.json"
        rates.write_text(json.dumps({"source": f"bank {name}", "per_usd": {day: rate}}))
        settings.BATCHDESK_FX_FILE = str(rates)
        kept = settled_unit(job, item, first if name == "a" else second, f"bd_unit_{name}")
        assert kept.rate == Decimal(rate)
    client.force_login(owner)
    [row] = jsonl_rows(export(client, job, "jsonl"))
    # 120 and 60 tokens at 1000 and 4000 a million, halved: 0.18 a draft; at 0.789 and at 0.8.
    charges = UnitCharge.objects.filter(job=job)
    assert Decimal(row["cost"]) == sum(c.cost for c in charges) == Decimal("0.28602")
    assert Decimal(row["cost_usd"]) == sum(c.cost_usd for c in charges) == Decimal("0.36")
    assert (row["currency"], row["rate"], row["rate_date"]) == ("GBP", "0.79450000", "2021-06-01")
    assert row["rate_source"] == "the rates its drafts' units were settled at, weighted"


def test_a_draft_settled_with_no_rate_in_force_is_costed_in_dollars_and_says_so(client, owner, settings):
    settings.BATCHDESK_CURRENCY = "GBP"
    settings.BATCHDESK_FX_FILE = ""
    job = JobFactory(owner=owner)
    item = ItemFactory(job=job, awaiting_review=True)
    kept = settled_unit(job, item, add_version(item), "bd_unit_no_rate")
    assert kept.settled_at is not None and kept.rate is None
    client.force_login(owner)
    [row] = jsonl_rows(export(client, job, "jsonl"))
    assert (row["cost"], row["currency"]) == (str(kept.cost_usd), "USD")
    assert row["cost_note"] == "no rate to GBP was in force: amount in USD"


def test_a_model_without_a_price_has_no_cost_and_says_so(client, owner):
    job = JobFactory(owner=owner, model="emulated-model")
    add_version(ItemFactory(job=job, awaiting_review=True))
    client.force_login(owner)
    [row] = jsonl_rows(export(client, job, "jsonl"))
    assert row["cost"] is None and row["cost_note"] == "price unknown for emulator/emulated-model"


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r"])
def test_every_formula_start_is_neutralised_in_csv_and_kept_in_jsonl(client, owner, start):
    job = JobFactory(owner=owner)
    ItemFactory(job=job, state=ItemState.REJECTED, reason=f"{start}1+1")
    client.force_login(owner)
    [row] = csv_rows(export(client, job, "csv"))
    assert row["reason"] == f"'{start}1+1"
    [row] = jsonl_rows(export(client, job, "jsonl"))
    assert row["reason"] == f"{start}1+1"


def test_nul_and_lone_surrogates_do_not_break_either_writer():
    # PostgreSQL stores neither, but the writers take any text they are given.
    text = "a\x00b\ud800c\udfffd ünïcode"
    values = dict.fromkeys(COLUMNS) | {"reason": text, "approved_text": "\ud83d"}
    row = tuple(values[column] for column in COLUMNS)
    [line] = b"".join(jsonl_stream([[row]])).decode().splitlines()
    assert json.loads(line)["reason"] == text and json.loads(line)["approved_text"] == "\ud83d"
    body = b"".join(csv_stream([[row]]))
    [read] = csv_rows(body)
    assert read["reason"] == "a\ufffdb\ufffdc\ufffdd ünïcode" and read["approved_text"] == "\ufffd"
    # A line without them keeps its non-ASCII text as it is.
    values.update(reason="ünïcode", approved_text=None)
    plain = b"".join(jsonl_stream([[tuple(values[column] for column in COLUMNS)]]))
    assert "ünïcode".encode() in plain


def test_queries_stay_flat_as_items_grow(client, owner):
    def queries_for(count: int) -> int:
        job = JobFactory(owner=owner)
        for _ in range(count):
            item = ItemFactory(job=job, awaiting_review=True)
            add_version(item)
        applied = ItemFactory(job=job, state=ItemState.APPLIED)
        Item.objects.filter(pk=applied.pk).update(approved_version=add_version(applied))
        forget_entered_rates()  # read again each time, rather than once within a few seconds
        with CaptureQueriesContext(connection) as queries:
            rows = jsonl_rows(export(client, job, "jsonl"))
        assert len(rows) == count + 1
        return len(queries)

    client.force_login(owner)
    assert queries_for(2) == queries_for(12)


def test_the_export_reads_a_chunk_of_items_at_a_time(client, owner, monkeypatch):
    monkeypatch.setattr("review.job_export.CHUNK_ITEMS", 3)
    job = JobFactory(owner=owner)
    items = [ItemFactory(job=job) for _ in range(7)]
    client.force_login(owner)
    rows = jsonl_rows(export(client, job, "jsonl"))
    assert [row["item_id"] for row in rows] == [item.pk for item in items]


def test_another_jobs_items_among_a_chunks_ids_are_left_out(client, owner, monkeypatch):
    # Each chunk reads approvals, attempts and drafts by the range of its item ids: another job's
    # items created in between fall in that range and must not lend this job their rows.
    monkeypatch.setattr("review.job_export.CHUNK_ITEMS", 2)
    ours, theirs = JobFactory(owner=owner), JobFactory()
    mine = []
    for _ in range(3):
        mine.append(ItemFactory(job=ours))
        other = ItemFactory(job=theirs, state=ItemState.APPLIED)
        version = add_version(other)
        Item.objects.filter(pk=other.pk).update(approved_version=version)
        DestinationAttempt.objects.create(
            item=other,
            version=version,
            destination="catalogue",
            operation_key=f"k{other.pk}",
            outcome="applied",
        )
    client.force_login(owner)
    rows = jsonl_rows(export(client, ours, "jsonl"))
    assert [row["item_id"] for row in rows] == [item.pk for item in mine]
    assert {
        (row["state"], row["cost"], row["approved_text"], row["destination_outcome"], row["published"])
        for row in rows
    } == {("prepared", None, None, None, False)}
    # A job without items: the header alone, or nothing.
    empty = JobFactory(owner=owner)
    assert csv_rows(export(client, empty, "csv")) == []
    assert export(client, empty, "jsonl") == b""


def test_the_file_name_is_made_safe_from_any_reference():
    job = JobFactory(reference='Q4 "launch"/\r\nrøde;=1')
    assert file_name(job, "csv") == f"job-{job.pk}-Q4_launch_r_de_1.csv"
    job = Job(pk=7, reference="\"'/..")
    assert file_name(job, "jsonl") == "job-7.jsonl"


def test_the_response_is_an_attachment_with_that_name(client, owner):
    job = JobFactory(owner=owner, reference='spring/2027 "catalogue"\nX-Injected: 1')
    client.force_login(owner)
    response = client.get(reverse("job_export", args=[job.pk]), {"format": "jsonl"})
    assert response.streaming
    assert response["Content-Type"] == "application/jsonl; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="{file_name(job, "jsonl")}"'
    assert "X-Injected" not in response
    response = client.get(reverse("job_export", args=[job.pk]))
    assert response["Content-Type"] == "text/csv; charset=utf-8"  # CSV when no format is named


# --- screens -------------------------------------------------------------------------------


def test_the_job_page_has_both_export_buttons(client, operator):
    job = JobFactory()
    client.force_login(operator)
    page = client.get(reverse("job_detail", args=[job.pk])).content.decode()
    url = reverse("job_export", args=[job.pk])
    assert f'href="{url}?format=csv"' in page and "Export CSV" in page
    assert f'href="{url}?format=jsonl"' in page and "Export JSONL" in page


@pytest.mark.parametrize("role", ["catalogue_owner", "operator", "admin"])
def test_every_role_may_export_on_the_screens(client, role):
    from tests.factories import UserFactory

    job = JobFactory()
    ItemFactory(job=job)
    client.force_login(UserFactory(roles=[role]))
    assert len(csv_rows(export(client, job, "csv"))) == 1


def test_the_screens_refuse_people_without_a_role_and_ask_strangers_to_log_in(client, outsider):
    job = JobFactory()
    url = reverse("job_export", args=[job.pk])
    response = client.get(url)
    assert response.status_code == 302 and reverse("login") in response.url
    client.force_login(outsider)
    assert client.get(url).status_code == 403


@pytest.mark.parametrize("query", [{"format": "xlsx"}, {"format": ""}, {"format": ["csv", "jsonl"]}])
def test_the_screens_refuse_an_unknown_format(client, owner, query):
    job = JobFactory()
    client.force_login(owner)
    response = client.get(reverse("job_export", args=[job.pk]), query)
    assert response.status_code == 400
    assert "format must be csv or jsonl" in response.content.decode()


def test_the_screens_answer_404_for_an_unknown_job(client, owner):
    client.force_login(owner)
    assert client.get("/jobs/987654321/export?format=csv").status_code == 404
    assert client.get(f"/jobs/{2**63}/export?format=csv").status_code == 404
