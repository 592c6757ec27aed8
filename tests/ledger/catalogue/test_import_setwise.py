"""The import's set-wise second pass against the verb it replaces: importing a file gives exactly
what `record_product` gives called once per row (issue 9, point 2): the same products, revisions
(numbers, hashes, fields), current revisions and statuses, and for products with items at work the
same item states, events and queued work."""

import json
import re
from pathlib import Path

import pytest
from django.db import transaction

import ledger.actions.jobs
import ledger.actions.products
from ledger.actions.products import record_product
from ledger.catalogue import Record, check_fields, import_catalogue, importing, merging, read_catalogue
from ledger.drafts.json_values import json_value_problem
from ledger.models import Event, Item, Job, Product, SourceRevision
from ledger.states import ItemState
from tests.factories import ItemFactory, JobFactory

pytestmark = [pytest.mark.django_db, pytest.mark.postgresql_only]

DIMENSIONS = {"w_cm": 30, "h_cm": 12, "finish": {"colour": "sage", "gloss": False}}
FIRST = [
    {"sku": "KEEP-1", "title": "Enamel saucepan", "materials": ["steel", "beech"], "dimensions": DIMENSIONS},
    {"sku": "KEYS-1", "title": "Desk lamp", "features": ["LED", "dimmable"], "dimensions": DIMENSIONS},
    {"sku": "REV-1", "title": "Wool throw", "price": 49.5},
    {"sku": "REV-ITEMS", "title": "Linen tea towel", "care": "40 C"},
    {"sku": "REV-APPLIED", "title": "Watering can", "litres": 5},
    {"sku": "WD-1", "title": "Side table", "status": "active"},
    {"sku": "WD-ITEMS", "title": "Pendant shade", "fields_note": "E27"},
    {"sku": "WD-REV", "title": "Chef's knife", "tang": "full"},
    {"sku": "REACT-1", "title": "Oak board", "status": "withdrawn"},
    {"sku": "REACT-REV", "title": "Bread bin", "status": "withdrawn"},
    {"sku": "NOSTATUS", "title": "Tea caddy", "status": "withdrawn"},
]
SECOND = [
    {"sku": "NEW-2", "title": "Teapot", "variants": [{"colour": "cream", "stock": 3}], "weight_g": 900},
    {"sku": "NEW-1", "title": "Jug", "status": "active", "empty": "", "nothing": None},
    {"sku": "NEW-WD", "title": "Vase", "status": "withdrawn"},
    # Same content, keys (nested ones too) in another order: no new revision.
    {"sku": "KEEP-1", "title": "Enamel saucepan", "materials": ["steel", "beech"], "dimensions": DIMENSIONS},
    {
        "dimensions": {"finish": {"gloss": False, "colour": "sage"}, "h_cm": 12, "w_cm": 30},
        "features": ["LED", "dimmable"],
        "title": "Desk lamp",
        "sku": "KEYS-1",
    },
    {"sku": "REV-1", "title": "Wool throw", "price": 52.0, "dimensions": {"w_cm": 130}},
    {"sku": "REV-ITEMS", "title": "Linen tea towel", "care": "60 C"},
    {"sku": "REV-APPLIED", "title": "Watering can", "litres": 7},
    {"sku": "WD-1", "title": "Side table", "status": "withdrawn"},
    {"sku": "WD-ITEMS", "title": "Pendant shade", "fields_note": "E27", "status": "withdrawn"},
    {"sku": "WD-REV", "title": "Chef's knife, 20 cm", "tang": "full", "status": "withdrawn"},
    {"sku": "REACT-1", "title": "Oak board", "status": "active"},
    {"sku": "REACT-REV", "title": "Bread bin, enamel", "status": "active"},
    # No status: a withdrawn product stays withdrawn.
    {"sku": "NOSTATUS", "title": "Tea caddy"},
]
# What each row above does, counted as the per-row import counted it.
SUMMARY = "created 3, revised 5, unchanged 3, withdrawn 3, rejected 0"


def jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def a_ledger_at_work(tmp_path: Path) -> None:
    """The first catalogue, and a job with items in several states on three of its products."""
    import_catalogue(jsonl(tmp_path / "first.jsonl", FIRST))
    job = JobFactory(reference="towels")
    products = {product.sku: product for product in Product.objects.all()}
    for sku, states in {
        "REV-ITEMS": [ItemState.PREPARED, ItemState.AWAITING_REVIEW, ItemState.SUBMITTED, ItemState.APPLIED],
        "WD-ITEMS": [ItemState.PREPARED, ItemState.APPROVED, ItemState.APPLYING, ItemState.REJECTED],
        "REV-APPLIED": [ItemState.APPLIED],
    }.items():
        for number, state in enumerate(states):
            # One item per revision in a job: the later ones stand for items of other jobs.
            ItemFactory(
                job=job if number == 0 else JobFactory(reference=f"{sku}-{number}"),
                product=products[sku],
                state=state,
            )


def ledger_contents() -> dict:
    """Everything an import may change, by business keys (ids differ between the two runs)."""
    revisions = SourceRevision.objects.select_related("product")
    events = Event.objects.select_related("job", "item__product", "item__source_revision")
    items = Item.objects.values_list("pk", "job__reference", "product__sku", "source_revision__number")
    item_keys = {pk: f"{job}/{sku}/r{number}" for pk, job, sku, number in items}

    def reason(text: str) -> str:
        # "replaces item 12": the item by what it is, not by its id.
        return re.sub(r"item (\d+)", lambda found: f"item {item_keys[int(found[1])]}", text)

    return {
        "products": sorted(Product.objects.values_list("sku", "status", "current_revision__number")),
        "revisions": sorted(
            ((r.product.sku, r.number, r.title, r.content_hash, r.fields) for r in revisions),
            key=lambda row: row[:2],
        ),
        "items": sorted(
            Item.objects.values_list(
                "job__reference",
                "product__sku",
                "source_revision__number",
                "state",
                "reason",
                "reason_code",
                "next_attempt_at",
            ),
            key=str,
        ),
        "events": sorted(
            (
                (
                    event.job.reference if event.job else None,
                    event.item.product.sku if event.item else None,
                    event.item.source_revision.number if event.item else None,
                    event.from_state,
                    event.to_state,
                    event.actor_name,
                    reason(event.reason),
                    json.dumps(event.data, sort_keys=True),
                )
                for event in events
            ),
            key=str,
        ),
        "jobs": sorted(Job.objects.values_list("reference", "state")),
    }


@pytest.fixture
def queued(monkeypatch):
    """The work the verbs queue on commit, by business keys."""
    work = []

    def enqueue(func: str, *args) -> None:
        if func == "ledger.tasks.apply_item":
            item = Item.objects.select_related("product").get(pk=args[0])
            work.append((func, item.product.sku, item.state))
        else:
            work.append((func, *(Job.objects.get(pk=arg).reference for arg in args)))

    monkeypatch.setattr(ledger.actions.products, "enqueue", enqueue)
    monkeypatch.setattr(ledger.actions.jobs, "enqueue", enqueue)
    return work


def record_each_row(path: Path) -> None:
    """The import as it was: `record_product` per row, in SKU order, in one transaction."""
    records = [row for row in read_catalogue(path) if isinstance(row, Record)]
    with transaction.atomic():
        for record in sorted(records, key=lambda record: record.sku):
            record_product(sku=record.sku, title=record.title, fields=record.fields, status=record.status)


def run_and_undo(tmp_path: Path, queued: list, write) -> tuple[dict, list]:
    with transaction.atomic():
        a_ledger_at_work(tmp_path)
        queued.clear()
        write(jsonl(tmp_path / "second.jsonl", SECOND))
        contents, work = ledger_contents(), sorted(queued)
        transaction.set_rollback(True)
    return contents, work


@pytest.mark.parametrize("chunk", [3, 5000], ids=["chunks-of-3", "one-chunk"])
def test_the_setwise_import_writes_what_record_product_writes_row_by_row(
    tmp_path, queued, monkeypatch, chunk
):
    reports = []
    monkeypatch.setattr(importing, "_WRITE_CHUNK", chunk)
    setwise, setwise_work = run_and_undo(
        tmp_path, queued, lambda path: reports.append(import_catalogue(path))
    )
    one_by_one, one_by_one_work = run_and_undo(tmp_path, queued, record_each_row)

    assert reports[0].summary == SUMMARY and reports[0].reactivated == 2
    assert setwise == one_by_one
    assert setwise_work == one_by_one_work
    # The scenario is the one intended: revisions, withdrawals and stopped items all happen.
    revisions = {(sku, number) for sku, number, *_ in setwise["revisions"]}
    assert {("KEYS-1", 2), ("KEEP-1", 2)}.isdisjoint(revisions)
    assert {("REV-1", 2), ("REV-ITEMS", 2), ("WD-REV", 2), ("REACT-REV", 2), ("NEW-2", 1)} <= revisions
    states = {(job, sku, number, state) for job, sku, number, state, *_ in setwise["items"]}
    assert {
        ("towels", "REV-ITEMS", 1, ItemState.OBSOLETE),
        ("towels", "REV-ITEMS", 2, ItemState.PREPARED),
        ("towels", "WD-ITEMS", 1, ItemState.WITHDRAWN),
        ("REV-ITEMS-2", "REV-ITEMS", 1, ItemState.SUBMITTED),
        ("towels", "REV-APPLIED", 1, ItemState.APPLIED),
        ("WD-ITEMS-2", "WD-ITEMS", 1, ItemState.APPLYING),
    } <= states
    assert ("ledger.tasks.apply_item", "WD-ITEMS", ItemState.APPLYING) in setwise_work
    assert dict((sku, status) for sku, status, _ in setwise["products"]) == {
        "KEEP-1": "active",
        "KEYS-1": "active",
        "NEW-1": "active",
        "NEW-2": "active",
        "NEW-WD": "withdrawn",
        "NOSTATUS": "withdrawn",
        "REACT-1": "active",
        "REACT-REV": "active",
        "REV-1": "active",
        "REV-APPLIED": "active",
        "REV-ITEMS": "active",
        "WD-1": "withdrawn",
        "WD-ITEMS": "withdrawn",
        "WD-REV": "withdrawn",
    }


def test_an_unchanged_reimport_writes_nothing(tmp_path):
    path = jsonl(tmp_path / "first.jsonl", FIRST)
    import_catalogue(path)
    before = {
        product.sku: (product.updated_at, product.current_revision_id) for product in Product.objects.all()
    }
    report = import_catalogue(path)
    assert report.summary == "created 0, revised 0, unchanged 11, withdrawn 0, rejected 0"
    assert {
        product.sku: (product.updated_at, product.current_revision_id) for product in Product.objects.all()
    } == before
    assert SourceRevision.objects.count() == len(FIRST)


@pytest.mark.parametrize(
    "value",
    [
        ["LED", {"w_cm": 30, "note": "a \\u0000 written out is text"}],
        ["LED", {"w_cm": 30, "note": "a NUL \x00 inside"}],
        {"k\ud800": 1},
        ["fine", "lone \udc00 surrogate"],
        {"a": [[[[[[[["eight deep"]]]]]]]]},
        {"a": [[[[[[[[["nine deep"]]]]]]]]]},
        [[1], [2], [3], [4], [5], [6], [7], [8], [9]],
        "ünïcode text",
    ],
)
def test_the_quick_look_at_a_record_refuses_exactly_what_the_field_by_field_check_refuses(value):
    """`check_fields` clears most records with one look at the whole; its answer is the walk's."""
    problems: list[str] = []
    fields = check_fields({"name": "x", "value": value}, problems)
    expected = json_value_problem(value, 'field "value"')
    assert problems == ([expected] if expected else [])
    assert fields == ({"name": "x"} if expected else {"name": "x", "value": value})


# New products only, as in a first import: fields of every kind, statuses given and not, a line
# with keys in another order and blank values, and a CSV-like flat row.
NEW_ONLY = [
    {"sku": "N-2", "title": "Teapot", "variants": [{"colour": "cream", "stock": 3}], "weight_g": 900},
    {"sku": "N-1", "title": "  Jug  ", "status": "Active", "empty": "", "nothing": None, "ratio": 0.1},
    {"sku": "N-WD", "title": "Vase", "status": "withdrawn", "dimensions": DIMENSIONS},
    {"dimensions": {"h_cm": 12, "w_cm": 30}, "title": "Desk lamp", "sku": "N-3", "ünï": "cödé"},
    {"sku": "N-4", "title": "Plain", "status": ""},
]


def line_digests() -> dict:
    return {
        sku: digest and bytes(digest) for sku, digest in Product.objects.values_list("sku", "line_digest")
    }


@pytest.mark.parametrize("chunk", [2, 5000], ids=["chunks-of-2", "one-chunk"])
def test_new_products_are_written_straight_from_the_rows_as_the_staged_merge_and_record_product_write_them(
    tmp_path, queued, monkeypatch, chunk
):
    """A chunk of new products only is written by one statement without staging
    (`_created_if_all_new`): the same products, revisions, hashes, statuses and line digests as
    the staged merge writes, and as `record_product` row by row."""
    monkeypatch.setattr(importing, "_WRITE_CHUNK", chunk)
    path = jsonl(tmp_path / "new.jsonl", NEW_ONLY)
    straight_calls = []
    straight = merging._created_if_all_new

    def counted(rows):
        straight_calls.append(written := straight(rows))
        return written

    def import_and_undo(write) -> tuple[dict, dict, list]:
        with transaction.atomic():
            reports = [write(path)]
            contents, digests = ledger_contents(), line_digests()
            transaction.set_rollback(True)
        return contents, digests, reports

    monkeypatch.setattr(merging, "_created_if_all_new", counted)
    written, written_digests, (report,) = import_and_undo(import_catalogue)
    assert straight_calls and all(straight_calls)

    monkeypatch.setattr(merging, "_created_if_all_new", lambda rows: False)
    staged, staged_digests, (staged_report,) = import_and_undo(import_catalogue)
    one_by_one, _, _ = import_and_undo(record_each_row)

    assert (
        report.summary
        == staged_report.summary
        == "created 5, revised 0, unchanged 0, withdrawn 0, rejected 0"
    )
    assert written == staged == one_by_one
    assert written_digests == staged_digests and all(written_digests.values())
    assert dict((sku, status) for sku, status, _ in written["products"]) == {
        "N-1": "active",
        "N-2": "active",
        "N-3": "active",
        "N-4": "active",
        "N-WD": "withdrawn",
    }
    # The next import of the same file recognises every line of the products written straight.
    assert import_catalogue(path).created == 5
    again = import_catalogue(path)
    assert again.summary == "created 0, revised 0, unchanged 5, withdrawn 0, rejected 0"
    assert again.recognised == 5


def test_a_chunk_with_one_known_sku_among_new_ones_is_staged_and_merged(tmp_path, monkeypatch):
    import_catalogue(jsonl(tmp_path / "first.jsonl", NEW_ONLY[:1]))
    straight_calls = []
    straight = merging._created_if_all_new
    monkeypatch.setattr(
        merging,
        "_created_if_all_new",
        lambda rows: straight_calls.append(straight(rows)) or straight_calls[-1],
    )
    changed = [{**NEW_ONLY[0], "weight_g": 950}, *NEW_ONLY[1:]]
    report = import_catalogue(jsonl(tmp_path / "second.jsonl", changed))
    assert straight_calls == [False]
    assert report.summary == "created 4, revised 1, unchanged 0, withdrawn 0, rejected 0"
    assert sorted(Product.objects.values_list("sku", "current_revision__number")) == [
        ("N-1", 1),
        ("N-2", 2),
        ("N-3", 1),
        ("N-4", 1),
        ("N-WD", 1),
    ]
