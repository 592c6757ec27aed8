"""An unchanged re-import recognises the lines it met before (issue 9, point 2): a product keeps the
digest of the line that made it what it is now, and a line with that digest changes nothing. These
tests hold the quick way to the full reading it skips: same reports, same revisions, same refusals,
and a product changed any other way is read again."""

import json
from pathlib import Path

import pytest
from django.db import connection

from ledger.actions.products import record_product, withdraw_product
from ledger.catalogue import import_catalogue, importing, revise_product
from ledger.catalogue.digests import KnownLines
from ledger.models import Product, SourceRevision

pytestmark = [pytest.mark.django_db, pytest.mark.postgresql_only]

DIMENSIONS = {"w_cm": 30, "finish": {"colour": "sage", "gloss": False}}


def line(n: int, **changes) -> str:
    record = {
        "sku": f"K-{n:04d}",
        "title": f"Lamp {n}",
        "features": ["LED", "dimmable"],
        "dimensions": DIMENSIONS,
    }
    record.update(changes)
    return json.dumps(record)


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(text + "\n" for text in lines), encoding="utf-8")
    return path


def state() -> list[tuple]:
    """Every product as the ledger has it, with its revisions."""
    products = [
        (product.sku, product.status, product.current_revision.number, product.current_revision.content_hash)
        for product in Product.objects.select_related("current_revision").order_by("sku")
    ]
    revisions = list(
        SourceRevision.objects.order_by("product__sku", "number").values_list(
            "product__sku", "number", "title", "fields", "content_hash"
        )
    )
    return products + revisions


def digests() -> dict[str, bytes | None]:
    return {
        sku: digest and bytes(digest) for sku, digest in Product.objects.values_list("sku", "line_digest")
    }


def test_an_unchanged_reimport_recognises_every_line_and_writes_nothing(tmp_path):
    path = write(tmp_path / "catalogue.jsonl", [line(n) for n in range(1, 21)])
    assert import_catalogue(path).summary == "created 20, revised 0, unchanged 0, withdrawn 0, rejected 0"
    before = state()
    updated = list(Product.objects.order_by("sku").values_list("updated_at", flat=True))

    report = import_catalogue(path)

    assert report.summary == "created 0, revised 0, unchanged 20, withdrawn 0, rejected 0"
    assert report.recognised == 20
    assert state() == before
    assert list(Product.objects.order_by("sku").values_list("updated_at", flat=True)) == updated


@pytest.mark.parametrize("recognise", [True, False], ids=["recognising", "reading-every-line"])
def test_recognising_lines_changes_no_outcome(tmp_path, monkeypatch, recognise):
    if not recognise:
        monkeypatch.setattr(importing, "may_recognise", lambda name: False)
    first = [line(n) for n in range(1, 9)]
    import_catalogue(write(tmp_path / "first.jsonl", first))
    second = [
        first[0],  # unchanged, recognised
        line(2, title="Lamp two"),  # revised
        line(3, status="withdrawn"),  # withdrawn
        first[3],  # unchanged
        json.dumps(json.loads(first[4]), sort_keys=True),  # same content, other bytes
        line(6, status="withdrawn", price=3),  # revised and withdrawn
        line(9),  # new
        # 7 and 8 are missing: left alone
    ]
    report = import_catalogue(write(tmp_path / "second.jsonl", second))
    assert report.summary == "created 1, revised 2, unchanged 3, withdrawn 2, rejected 0"
    assert report.recognised == (2 if recognise else 0)
    # The second file again, but for K-0003, which is brought back.
    third = [*second[:2], *second[3:], line(3, status="active")]
    report = import_catalogue(write(tmp_path / "third.jsonl", third))
    assert report.summary == "created 0, revised 0, unchanged 6, withdrawn 0, rejected 0"
    assert report.reactivated == 1
    # Every line of the second file made or left its product as it is: each is recognised now.
    assert report.recognised == (6 if recognise else 0)

    assert [(sku, status, number) for sku, status, number, _ in state()[:9]] == [
        ("K-0001", "active", 1),
        ("K-0002", "active", 2),
        ("K-0003", "active", 1),
        ("K-0004", "active", 1),
        ("K-0005", "active", 1),
        ("K-0006", "withdrawn", 2),
        ("K-0007", "active", 1),
        ("K-0008", "active", 1),
        ("K-0009", "active", 1),
    ]


def test_a_product_changed_any_other_way_is_read_again(tmp_path):
    path = write(tmp_path / "catalogue.jsonl", [line(n) for n in range(1, 6)])
    import_catalogue(path)
    revise_product(sku="K-0001", title="Lamp renamed", fields={"features": ["LED"]})
    withdraw_product(sku="K-0002")

    report = import_catalogue(path)

    # K-0001 goes back to the file's content; K-0002's line says no status, so it stays withdrawn.
    assert report.summary == "created 0, revised 1, unchanged 4, withdrawn 0, rejected 0"
    assert report.recognised == 3
    product = Product.objects.select_related("current_revision").get(sku="K-0001")
    assert (product.current_revision.number, product.current_revision.title) == (3, "Lamp 1")
    assert Product.objects.get(sku="K-0002").status == "withdrawn"


def test_the_digest_is_cleared_when_revision_or_status_change_otherwise(tmp_path):
    import_catalogue(write(tmp_path / "catalogue.jsonl", [line(n) for n in range(1, 4)]))
    assert all(digest and len(digest) == 24 for digest in digests().values())

    record_product(sku="K-0001", title="Lamp 1", fields={"other": 1})  # a new revision
    withdraw_product(sku="K-0002")  # the status
    Product.objects.filter(sku="K-0003").update(published_content="Published")  # neither

    assert digests()["K-0001"] is None
    assert digests()["K-0002"] is None
    assert digests()["K-0003"] is not None


@pytest.mark.parametrize(
    "lines, message",
    [
        ([line(1), line(2), line(1)], 'line 3: sku "K-0001" appears again (first on line 1)'),
        ([line(1), line(2), line(1, title="Other")], 'line 3: sku "K-0001" appears again (first on line 1)'),
        ([line(1, title="Other"), line(2), line(1)], 'line 3: sku "K-0001" appears again (first on line 1)'),
    ],
    ids=["the-same-line-twice", "a-known-line-then-another", "another-then-a-known-line"],
)
def test_a_repeated_sku_is_refused_whether_its_lines_are_known_or_not(tmp_path, lines, message):
    import_catalogue(write(tmp_path / "first.jsonl", [line(1), line(2)]))
    before = state()

    report = import_catalogue(write(tmp_path / "second.jsonl", lines))

    assert [str(error) for error in report.errors] == [message]
    assert report.imported is False
    assert state() == before


def test_a_line_whose_product_changed_during_the_import_starts_it_again_reading_every_line(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(importing, "_WRITE_CHUNK", 2)
    path = write(tmp_path / "catalogue.jsonl", [line(n) for n in range(1, 7)])
    import_catalogue(path)
    changed = []

    def change_a_later_product(report):
        # Inside the import's transaction, after its first chunk: the product of line 5 is no
        # longer what its line made (as after a change committed by someone else meanwhile).
        if not changed:
            with connection.cursor() as cursor:
                cursor.execute("UPDATE ledger_product SET line_digest = NULL WHERE sku = 'K-0005'")
            changed.append(report.rows_written)

    report = import_catalogue(path, on_progress=change_a_later_product)

    assert changed == [2]
    assert report.summary == "created 0, revised 0, unchanged 6, withdrawn 0, rejected 0"
    assert report.recognised == 0  # the second time, every line was read
    # The first attempt was rolled back with what it changed; the second recorded the digest again.
    assert all(digests().values())


def test_products_from_before_digests_get_theirs_at_the_next_import(tmp_path):
    path = write(tmp_path / "catalogue.jsonl", [line(n) for n in range(1, 4)])
    import_catalogue(path)
    Product.objects.update(line_digest=None)

    assert import_catalogue(path).recognised == 0
    assert import_catalogue(path).recognised == 3


def test_csv_rows_are_always_read(tmp_path):
    path = tmp_path / "catalogue.csv"
    path.write_text("sku,title,colour\nC-1,Mug,blue\nC-2,Cup,red\n", encoding="utf-8")
    import_catalogue(path)

    report = import_catalogue(path)

    assert report.summary == "created 0, revised 0, unchanged 2, withdrawn 0, rejected 0"
    assert report.recognised == 0
    assert set(digests().values()) == {None}


def test_the_known_lines_are_read_a_batch_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr(KnownLines, "_BATCH", 2)
    path = write(tmp_path / "catalogue.jsonl", [line(n) for n in range(1, 6)])
    import_catalogue(path)

    report = import_catalogue(path)

    assert report.recognised == 5
    assert report.summary == "created 0, revised 0, unchanged 5, withdrawn 0, rejected 0"
