import json
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command

from ledger.catalogue import MAX_RECORD_BYTES, Record, import_catalogue, read_catalogue
from ledger.models import Product, ProductStatus, SourceRevision

pytestmark = pytest.mark.django_db

SAMPLE = Path(__file__).resolve().parents[3] / "sample"


def jsonl(*records: dict) -> bytes:
    return b"".join(json.dumps(record).encode() + b"\n" for record in records)


def write(tmp_path: Path, name: str, content: bytes | str) -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def ledger_size() -> tuple[int, int]:
    return Product.objects.count(), SourceRevision.objects.count()


MUG = {"sku": "KIT-1", "title": "Stoneware mug", "colour": "blue", "price": "12.50 EUR"}
BOARD = {"sku": "KIT-2", "title": "Oak board", "material": "oak"}
LAMP = {"sku": "LIG-1", "title": "Desk lamp", "colour": "black"}


def test_second_import_counts_revised_unchanged_withdrawn_and_created(tmp_path):
    first = import_catalogue(write(tmp_path, "first.jsonl", jsonl(MUG, BOARD, LAMP)))
    assert first.summary == "created 3, revised 0, unchanged 0, withdrawn 0, rejected 0"
    assert first.imported

    second = import_catalogue(
        write(
            tmp_path,
            "second.jsonl",
            jsonl(
                {**MUG, "price": "11.00 EUR"},
                BOARD,
                {**LAMP, "status": "withdrawn"},
                {"sku": "TOY-1", "title": "Kite"},
            ),
        )
    )

    assert second.summary == "created 1, revised 1, unchanged 1, withdrawn 1, rejected 0"
    mug = Product.objects.get(sku="KIT-1")
    assert mug.current_revision.number == 2
    assert mug.current_revision.fields["price"] == "11.00 EUR"
    assert Product.objects.get(sku="LIG-1").status == ProductStatus.WITHDRAWN
    # Withdrawing is a status change, not a content change.
    assert Product.objects.get(sku="LIG-1").revisions.count() == 1


def test_identical_reimport_makes_no_new_revision(tmp_path):
    path = write(tmp_path, "catalogue.jsonl", jsonl(MUG, BOARD))
    import_catalogue(path)
    before = ledger_size()

    report = import_catalogue(path)

    assert report.summary == "created 0, revised 0, unchanged 2, withdrawn 0, rejected 0"
    assert ledger_size() == before


def test_csv_and_jsonl_describe_the_same_content(tmp_path):
    import_catalogue(write(tmp_path, "catalogue.jsonl", jsonl(MUG, BOARD)))
    csv_text = (
        "sku,title,colour,price,material\n"
        "KIT-1,Stoneware mug,blue,12.50 EUR,\n"
        "KIT-2, Oak board ,,, oak \n"  # surrounding spaces are stripped; empty cells are no field
    )

    report = import_catalogue(write(tmp_path, "catalogue.csv", csv_text))

    assert report.summary == "created 0, revised 0, unchanged 2, withdrawn 0, rejected 0"


def test_csv_creates_products_with_fields_and_status(tmp_path):
    csv_text = 'sku,title,status,colour\nLIG-1,"Lamp, black",withdrawn,black\nLIG-2,Lamp,,\n'

    report = import_catalogue(write(tmp_path, "lamps.csv", csv_text))

    assert report.summary == "created 2, revised 0, unchanged 0, withdrawn 0, rejected 0"
    lamp = Product.objects.get(sku="LIG-1")
    assert lamp.status == ProductStatus.WITHDRAWN
    assert lamp.current_revision.title == "Lamp, black"
    assert lamp.current_revision.fields == {"colour": "black"}
    assert Product.objects.get(sku="LIG-2").current_revision.fields == {}


def test_jsonl_keeps_numbers_and_booleans_and_drops_nulls(tmp_path):
    record = {"sku": "X-1", "title": "  Kettle  ", "litres": 1.7, "pieces": 3, "cordless": True, "note": None}

    import_catalogue(write(tmp_path, "kettle.jsonl", jsonl(record)))

    revision = Product.objects.get(sku="X-1").current_revision
    assert revision.title == "Kettle"
    assert revision.fields == {"litres": 1.7, "pieces": 3, "cordless": True}


def test_a_missing_status_leaves_it_alone_and_active_brings_a_product_back(tmp_path):
    import_catalogue(write(tmp_path, "a.jsonl", jsonl({**MUG, "status": "withdrawn"}, BOARD)))

    kept = import_catalogue(write(tmp_path, "b.jsonl", jsonl(MUG)))
    assert kept.unchanged == 1
    assert Product.objects.get(sku="KIT-1").status == ProductStatus.WITHDRAWN

    back = import_catalogue(write(tmp_path, "c.jsonl", jsonl({**MUG, "status": "active"})))
    assert back.summary == "created 0, revised 0, unchanged 0, withdrawn 0, rejected 0"
    assert back.reactivated == 1
    assert Product.objects.get(sku="KIT-1").status == ProductStatus.ACTIVE
    # Products missing from a file are left alone.
    assert Product.objects.get(sku="KIT-2").current_revision.number == 1


def test_a_product_created_withdrawn_counts_as_created(tmp_path):
    report = import_catalogue(write(tmp_path, "a.jsonl", jsonl({**MUG, "status": "withdrawn"})))

    assert (report.created, report.withdrawn) == (1, 0)


OVERSIZED_JSON = json.dumps({"sku": "BIG-1", "title": "Big", "notes": "x" * MAX_RECORD_BYTES}).encode()
BAD_FILES = [
    pytest.param(
        "bad.jsonl",
        jsonl(MUG) + b'{"sku": "KIT-9", "title": "Jar",}\n' + jsonl(LAMP),
        2,
        "not valid JSON",
        id="malformed-json",
    ),
    pytest.param(
        "bad.jsonl",
        jsonl(MUG, LAMP) + b"\n" + jsonl({"sku": "a b", "title": "Jar"}),
        4,
        'sku "a b" is not valid (letters, digits, . _ - ; at most 64)',
        id="bad-sku-after-a-blank-line",
    ),
    pytest.param("bad.jsonl", jsonl(MUG, {"sku": "KIT-9"}, LAMP), 2, "title is missing", id="missing-title"),
    pytest.param(
        "bad.jsonl", jsonl(MUG, {"sku": "KIT-9", "title": "   "}), 2, "title is empty", id="blank-title"
    ),
    pytest.param(
        "bad.jsonl", jsonl(MUG, {"sku": "KIT-9", "title": "t" * 301}), 2, "301 characters", id="long-title"
    ),
    pytest.param(
        "bad.jsonl",
        jsonl(MUG) + '{"sku": "KIT-9", "title": "Caf\u00e9 cup"}\n'.encode("latin-1") + jsonl(LAMP),
        2,
        "not valid UTF-8 (byte 0xe9",
        id="latin-1-jsonl",
    ),
    pytest.param(
        "bad.jsonl", jsonl(MUG, LAMP) + OVERSIZED_JSON + b"\n", 3, "at most 65,536", id="oversized-jsonl"
    ),
    pytest.param(
        "bad.jsonl",
        jsonl(MUG, {"sku": "KIT-9", "title": "Jar", "status": "gone"}),
        2,
        'status "gone"',
        id="status",
    ),
    pytest.param(
        "bad.jsonl", jsonl(MUG) + b'["KIT-9", "Jar"]\n', 2, "expected a JSON object", id="not-an-object"
    ),
    pytest.param(
        "bad.jsonl", jsonl(MUG, {"sku": "KIT-9", "title": "Jar\u0000"}), 2, "NUL character", id="nul-in-title"
    ),
    pytest.param(
        "bad.jsonl", jsonl(MUG, LAMP, MUG), 3, 'sku "KIT-1" appears again (first on line 1)', id="dup"
    ),
    pytest.param(
        "bad.csv",
        "sku,title\nKIT-1,Mug\nKIT-9\nLIG-1,Lamp\n",
        3,
        "title is missing",
        id="csv-missing-title",
    ),
    pytest.param(
        "bad.csv",
        'sku,title\nKIT-1,"Mug\nwith lid"\nKIT 9,Jar\n',
        4,
        'sku "KIT 9" is not valid',
        id="csv-line-number-after-a-quoted-line-break",
    ),
    pytest.param(
        "bad.csv",
        b"sku,title\nKIT-1,Mug\n" + "KIT-9,Caf\u00e9 cup\n".encode("cp1252") + b"LIG-1,Lamp\n",
        3,
        "not valid UTF-8",
        id="cp1252-csv",
    ),
    pytest.param(
        "bad.csv",
        "sku,title,notes\nKIT-1,Mug,\nKIT-9,Jar," + "x" * (MAX_RECORD_BYTES + 1) + "\nLIG-1,Lamp,\n",
        3,
        "at most 65,536",
        id="oversized-csv",
    ),
    pytest.param(
        "bad.csv",
        'sku,title,notes\nKIT-1,Mug,\nKIT-9,Jar,"' + ("y" * 1000 + "\n") * 70 + '"\nLIG-1,Lamp,\n',
        3,
        "at most 65,536",
        id="oversized-csv-across-many-lines",
    ),
    pytest.param("bad.csv", "sku,title\nKIT-1,Mug\nKIT-9,Jar,extra\n", 3, "3 cells", id="csv-extra-cell"),
    pytest.param(
        "bad.csv", 'sku,title\nKIT-1,Mug\nKIT-9,"Jar" lid\n', 3, "not valid CSV", id="csv-stray-quote"
    ),
]


@pytest.mark.parametrize(("name", "content", "line", "message"), BAD_FILES)
def test_a_rejected_row_stops_the_whole_import(tmp_path, name, content, line, message):
    import_catalogue(write(tmp_path, "before.jsonl", jsonl({**MUG, "title": "Old mug"})))
    before = ledger_size()

    report = import_catalogue(write(tmp_path, name, content))

    assert not report.imported
    assert report.rejected == 1
    assert [error.line for error in report.errors] == [line]
    assert message in report.errors[0].message
    assert str(report.errors[0]).startswith(f"line {line}: ")
    assert (report.created, report.revised, report.unchanged, report.withdrawn) == (0, 0, 0, 0)
    assert ledger_size() == before
    assert Product.objects.get(sku="KIT-1").current_revision.title == "Old mug"


def test_a_record_of_exactly_64_kb_is_accepted(tmp_path):
    bare = len(json.dumps({"sku": "BIG-1", "title": "Big", "notes": ""}).encode())
    record = {"sku": "BIG-1", "title": "Big", "notes": "x" * (MAX_RECORD_BYTES - bare)}
    line = json.dumps(record).encode()
    assert len(line) == MAX_RECORD_BYTES

    report = import_catalogue(write(tmp_path, "big.jsonl", line + b"\r\n"))

    assert report.created == 1


def test_skip_invalid_imports_the_valid_rows(tmp_path):
    content = jsonl(MUG) + b"{not json\n" + jsonl({"sku": "a b", "title": "x"}, LAMP)

    report = import_catalogue(write(tmp_path, "mixed.jsonl", content), skip_invalid=True)

    assert report.imported
    assert report.summary == "created 2, revised 0, unchanged 0, withdrawn 0, rejected 2"
    assert [error.line for error in report.errors] == [2, 3]
    assert sorted(Product.objects.values_list("sku", flat=True)) == ["KIT-1", "LIG-1"]


@pytest.mark.parametrize("skip_invalid", [False, True])
def test_a_csv_header_without_title_rejects_the_file(tmp_path, skip_invalid):
    path = write(tmp_path, "no-title.csv", "sku,name\nKIT-1,Mug\n")

    report = import_catalogue(path, skip_invalid=skip_invalid)

    assert not report.imported
    assert [str(error) for error in report.errors] == [
        "line 1: the header must name the columns sku and title (missing: title)"
    ]
    assert ledger_size() == (0, 0)


def test_a_byte_order_mark_and_crlf_line_ends_are_fine(tmp_path):
    path = write(tmp_path, "excel.csv", b"\xef\xbb\xbfsku,title\r\nKIT-1,Mug\r\n")

    assert import_catalogue(path).created == 1
    assert Product.objects.get(sku="KIT-1").current_revision.title == "Mug"


def test_an_uploaded_file_is_read_and_its_format_sniffed():
    upload = SimpleUploadedFile("catalogue.txt", b"\n\n" + jsonl(MUG, LAMP))
    assert import_catalogue(upload).created == 2

    csv_upload = SimpleUploadedFile("catalogue", b"sku,title\nKIT-2,Board\n")
    rows = list(read_catalogue(csv_upload))
    assert rows == [Record(2, "KIT-2", "Board", None, {})]


def test_command_prints_the_summary(tmp_path, capsys):
    call_command("import_catalogue", str(write(tmp_path, "a.jsonl", jsonl(MUG, LAMP))))

    assert capsys.readouterr().out == "created 2, revised 0, unchanged 0, withdrawn 0, rejected 0\n"


def test_command_exits_1_with_a_line_numbered_report_when_rows_are_rejected(tmp_path, capsys):
    path = write(tmp_path, "bad.jsonl", jsonl(MUG) + b"{oops\n" + jsonl({"sku": "KIT-9"}))

    with pytest.raises(CommandError) as stopped:
        call_command("import_catalogue", str(path))

    assert stopped.value.returncode == 1
    message = str(stopped.value)
    assert "Nothing was imported" in message
    assert "line 2: not valid JSON" in message
    assert "line 3: title is missing" in message
    assert capsys.readouterr().out == "created 0, revised 0, unchanged 0, withdrawn 0, rejected 2\n"
    assert ledger_size() == (0, 0)


def test_command_with_skip_invalid_reports_rejected_lines_and_succeeds(tmp_path, capsys):
    path = write(tmp_path, "bad.jsonl", jsonl(MUG) + b"{oops\n")

    call_command("import_catalogue", str(path), "--skip-invalid")

    out, err = capsys.readouterr()
    assert out == "created 1, revised 0, unchanged 0, withdrawn 0, rejected 1\n"
    assert "line 2: not valid JSON" in err


def test_command_reports_a_missing_file(tmp_path):
    with pytest.raises(CommandError, match="Cannot read"):
        call_command("import_catalogue", str(tmp_path / "nowhere.jsonl"))


def test_the_sample_catalogue_and_its_update_import_cleanly():
    first = import_catalogue(SAMPLE / "catalogue.jsonl")

    assert first.summary == "created 200, revised 0, unchanged 0, withdrawn 0, rejected 0"
    assert Product.objects.filter(status=ProductStatus.WITHDRAWN).count() == 10
    assert len(set(Product.objects.values_list("current_revision__fields__category", flat=True))) == 8

    update = import_catalogue(SAMPLE / "catalogue-update.csv")

    assert update.summary == "created 2, revised 3, unchanged 3, withdrawn 2, rejected 0"
    assert Product.objects.count() == 202
    assert Product.objects.filter(status=ProductStatus.WITHDRAWN).count() == 12
    assert SourceRevision.objects.filter(number=2).count() == 3
