"""A file changes only what it names (SPEC §7, rule 16): a column absent from a CSV header or a key
absent from a JSONL record leaves that field as it is; `--replace` makes each record the whole
content; `--dry-run` says what an import would do, with the work of unfinished jobs it would stop
and queue again and its estimated cost, and changes nothing."""

import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from ledger.catalogue import import_catalogue
from ledger.models import Event, Item, Product, SourceRevision
from ledger.states import ItemState
from tests.factories import ItemFactory, JobFactory
from tests.ledger.catalogue.test_import_setwise import SECOND, SUMMARY, a_ledger_at_work, ledger_contents
from tests.ledger.catalogue.test_import_setwise import jsonl as setwise_jsonl

pytestmark = pytest.mark.django_db

LAMP = {
    "sku": "LAMP-1",
    "title": "Desk lamp",
    "brand": "Lumen",
    "category": "Lighting",
    "price": "49.00",
    "features": ["LED", "dimmable"],
    "certifications": {"ce": True, "ukca": True},
}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def jsonl(tmp_path: Path, name: str, *records: dict) -> Path:
    return write(tmp_path, name, "".join(json.dumps(record) + "\n" for record in records))


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("import_catalogue", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def lamp() -> SourceRevision:
    return Product.objects.get(sku="LAMP-1").current_revision


def ledger_size() -> dict:
    return {model.__name__: model.objects.count() for model in (Product, SourceRevision, Item, Event)} | {
        "states": sorted(Item.objects.values_list("pk", "state"))
    }


@pytest.fixture
def catalogue(tmp_path):
    import_catalogue(jsonl(tmp_path, "first.jsonl", LAMP))


def test_a_csv_with_some_columns_changes_only_those_through_the_command(tmp_path, catalogue):
    out = run(str(write(tmp_path, "prices.csv", "sku,title,price\nLAMP-1,Desk lamp,45.00\n")))

    assert out.splitlines()[0] == "created 0, revised 1, unchanged 0, withdrawn 0, rejected 0"
    assert "fields changed: price (1)" in out
    assert "LAMP-1: price" in out
    revision = lamp()
    assert revision.number == 2
    assert revision.fields == {
        **{k: v for k, v in LAMP.items() if k not in ("sku", "title")},
        "price": "45.00",
    }


def test_a_jsonl_record_leaves_the_keys_it_does_not_name_and_null_or_blank_removes_a_field(
    tmp_path, catalogue
):
    path = jsonl(
        tmp_path,
        "partial.jsonl",
        {"sku": "LAMP-1", "title": "Desk lamp", "brand": None, "category": "", "price": "39.00"},
    )
    report = import_catalogue(path)

    assert report.revised == 1
    assert report.revisions == [("LAMP-1", ["brand", "category", "price"])]
    assert lamp().fields == {
        "price": "39.00",
        "features": ["LED", "dimmable"],
        "certifications": {"ce": True, "ukca": True},
    }


def test_a_csv_row_shorter_than_its_header_blanks_the_columns_it_lacks(tmp_path, catalogue):
    import_catalogue(write(tmp_path, "short.csv", "sku,title,price,brand\nLAMP-1,Desk lamp,45.00\n"))

    assert "brand" not in lamp().fields
    assert lamp().fields["category"] == "Lighting"


def test_a_nested_object_is_one_field_replaced_whole(tmp_path, catalogue):
    import_catalogue(
        jsonl(tmp_path, "ce.jsonl", {"sku": "LAMP-1", "title": "Desk lamp", "certifications": {"ce": True}})
    )

    assert lamp().fields["certifications"] == {"ce": True}
    assert lamp().fields["brand"] == "Lumen"


def test_a_file_naming_what_a_product_already_has_makes_no_revision(tmp_path, catalogue):
    out = run(str(write(tmp_path, "same.csv", "sku,title,brand\nLAMP-1,Desk lamp,Lumen\n")))

    assert out.splitlines()[0] == "created 0, revised 0, unchanged 1, withdrawn 0, rejected 0"
    assert lamp().number == 1


def test_replace_makes_each_record_the_whole_content(tmp_path, catalogue):
    path = write(tmp_path, "prices.csv", "sku,title,price\nLAMP-1,Desk lamp,45.00\n")

    out = run(str(path), "--replace")

    assert out.splitlines()[0] == "created 0, revised 1, unchanged 0, withdrawn 0, rejected 0"
    assert "fields changed: brand (1), category (1), certifications (1), features (1), price (1)" in out
    assert lamp().fields == {"price": "45.00"}


def test_a_partial_line_met_again_is_unchanged_but_replace_does_not_take_it_for_the_whole_record(
    tmp_path, catalogue
):
    path = jsonl(tmp_path, "partial.jsonl", {"sku": "LAMP-1", "title": "Desk lamp", "price": "45.00"})
    assert import_catalogue(path).revised == 1

    again = import_catalogue(path)
    assert (again.revised, again.unchanged) == (0, 1)

    replaced = import_catalogue(path, replace=True)
    assert replaced.revised == 1
    assert lamp().fields == {"price": "45.00"}


def test_a_whole_line_met_again_is_recognised_in_either_mode(tmp_path, catalogue):
    path = jsonl(tmp_path, "first.jsonl", LAMP)
    assert import_catalogue(path).recognised == 1
    assert import_catalogue(path, replace=True).unchanged == 1


@pytest.fixture
def lamp_at_work(catalogue):
    """The lamp in two unfinished jobs (one draft awaiting review, one item waiting to be sent), a
    cancelled job and an applied draft."""
    product = Product.objects.get(sku="LAMP-1")
    ItemFactory(job=JobFactory(reference="spring"), product=product, state=ItemState.AWAITING_REVIEW)
    ItemFactory(job=JobFactory(reference="summer"), product=product, state=ItemState.PREPARED)
    ItemFactory(job=JobFactory(reference="old", state="cancelled"), product=product, state=ItemState.PREPARED)
    ItemFactory(job=JobFactory(reference="done"), product=product, state=ItemState.APPLIED)


def test_a_dry_run_says_what_would_happen_with_its_cost_and_changes_nothing(tmp_path, lamp_at_work):
    path = write(tmp_path, "prices.csv", "sku,title,price\nLAMP-1,Desk lamp,45.00\nNEW-1,Mug,9.00\n")
    before = ledger_size()

    out = run(str(path), "--dry-run")

    assert out.splitlines()[0] == "created 1, revised 1, unchanged 0, withdrawn 0, rejected 0"
    assert "LAMP-1: price" in out
    assert "unfinished jobs: 3 items become obsolete and 2 are queued again (estimated cost " in out
    assert "job spring: 1 obsolete, 1 queued again, estimated " in out
    assert "job old: 1 obsolete, 0 queued again, 0 withdrawn" in out
    assert out.rstrip().endswith("Dry run: nothing was changed.")
    assert ledger_size() == before


def test_what_a_dry_run_foresees_is_what_the_import_does(tmp_path, lamp_at_work):
    path = write(tmp_path, "prices.csv", "sku,title,price\nLAMP-1,Desk lamp,45.00\n")
    preview = import_catalogue(path, dry_run=True)
    assert not preview.imported and preview.dry_run
    assert preview.requeue_cost is not None and preview.requeue_cost > 0

    report = import_catalogue(path)

    assert report.imported and not report.dry_run
    stopped = Item.objects.filter(product__sku="LAMP-1", state=ItemState.OBSOLETE)
    queued = Item.objects.filter(source_revision=lamp(), state=ItemState.PREPARED)
    assert (preview.items_obsolete, preview.items_requeued) == (report.items_obsolete, report.items_requeued)
    # The cancelled job's item is cancelled with its job's work, not queued again.
    assert stopped.exclude(job__state="cancelled").count() + 1 == preview.items_obsolete == 3
    assert sorted(queued.values_list("job__reference", flat=True)) == ["spring", "summer"]
    assert preview.requeue_cost == report.requeue_cost


def test_a_withdrawal_is_counted_apart_and_queues_nothing(tmp_path, lamp_at_work):
    report = import_catalogue(
        write(tmp_path, "gone.csv", "sku,title,status\nLAMP-1,Desk lamp,withdrawn\n"), dry_run=True
    )

    assert (report.withdrawn, report.items_withdrawn, report.items_requeued) == (1, 3, 0)


def test_a_refused_dry_run_says_why_and_changes_nothing(tmp_path, catalogue):
    before = ledger_size()
    with pytest.raises(CommandError, match="line 3: title is empty"):
        run(str(write(tmp_path, "bad.csv", "sku,title,price\nLAMP-1,Desk lamp,1\nLAMP-2,,2\n")), "--dry-run")
    assert ledger_size() == before


def test_a_partial_record_is_compared_as_json_where_python_would_take_true_for_one(tmp_path):
    import_catalogue(
        jsonl(tmp_path, "first.jsonl", {"sku": "JAR-1", "title": "Jar", "lid": 1, "glass": "clear"})
    )

    same = import_catalogue(jsonl(tmp_path, "same.jsonl", {"sku": "JAR-1", "title": "Jar", "lid": 1}))
    changed = import_catalogue(jsonl(tmp_path, "true.jsonl", {"sku": "JAR-1", "title": "Jar", "lid": True}))

    assert (same.revised, same.unchanged) == (0, 1)
    assert changed.revisions == [("JAR-1", ["lid"])]
    assert Product.objects.get(sku="JAR-1").current_revision.fields == {"lid": True, "glass": "clear"}


@pytest.mark.postgresql_only
def test_a_dry_run_counts_products_with_items_at_work_as_the_import_does_and_changes_nothing(tmp_path):
    # A dry run merges every row set-wise, judging no item: its counts are still the import's.
    a_ledger_at_work(tmp_path)
    path = setwise_jsonl(tmp_path / "second.jsonl", SECOND)
    before = ledger_contents()

    preview = import_catalogue(path, replace=True, dry_run=True)

    assert preview.summary == SUMMARY and (preview.dry_run, preview.imported) == (True, False)
    assert ledger_contents() == before
    report = import_catalogue(path, replace=True)
    assert report.summary == SUMMARY
    assert (preview.reactivated, preview.revisions, preview.changed_fields) == (
        report.reactivated,
        report.revisions,
        report.changed_fields,
    )
    assert (preview.items_obsolete, preview.items_requeued, preview.items_withdrawn) == (
        report.items_obsolete,
        report.items_requeued,
        report.items_withdrawn,
    )
