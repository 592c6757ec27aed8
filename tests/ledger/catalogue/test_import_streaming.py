"""Imports a person can live with: bounded memory, the first 100 problems and a count of the
rest, and uploads imported by a worker that is safe to run twice."""

import io
import json
import sys
import tracemalloc
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from ledger import catalogue
from ledger.catalogue import (
    MAX_RECORD_BYTES,
    StoredFile,
    import_catalogue,
    importing,
    read_catalogue,
    uploads,
)
from ledger.models import CatalogueImport, CatalogueImportChunk, ImportState, Product
from ledger.tasks import import_catalogue_file
from ledger.workers.thread_switching import SWITCH_INTERVAL
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def rows(count: int, *, start: int = 0) -> bytes:
    return b"".join(
        json.dumps({"sku": f"S-{n:06d}", "title": f"Lamp {n}", "features": ["LED", "dimmable"]}).encode()
        + b"\n"
        for n in range(start, start + count)
    )


def test_a_file_of_30000_rows_is_checked_without_holding_its_records(tmp_path, monkeypatch):
    # Rows are held a few chunks at a time (the one written, the ones read ahead): small chunks
    # here, so holding the file's records would show.
    monkeypatch.setattr(importing, "_WRITE_CHUNK", 500)
    path = tmp_path / "big.jsonl"
    path.write_bytes(rows(30_000) + b'{"sku": "S-000001", "title": "Again"}\n')

    tracemalloc.start()
    try:
        report = import_catalogue(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert report.summary == "created 0, revised 0, unchanged 0, withdrawn 0, rejected 1"
    assert [str(error) for error in report.errors] == [
        'line 30001: sku "S-000001" appears again (first on line 2)'
    ]
    # Holding 30,000 records would take tens of megabytes; the SKU table takes 1 MB, the chunks
    # held (each row with its line's digest) about 3.
    assert peak < 5_000_000


def test_the_first_chunk_is_small_so_the_database_starts_writing_early(tmp_path, monkeypatch):
    monkeypatch.setattr(importing, "_WRITE_CHUNK", 500)
    path = tmp_path / "twelve-hundred.jsonl"
    path.write_bytes(rows(1_200))
    written = []

    report = import_catalogue(path, on_progress=lambda report: written.append(report.rows_written))

    assert report.created == 1_200
    # Progress is told after each chunk written: a fifth of a chunk first, then full ones.
    assert sorted(set(written) - {0}) == [100, 600, 1_100, 1_200]


def test_rows_are_written_in_chunks_inside_one_transaction(tmp_path, monkeypatch):
    monkeypatch.setattr(importing, "_WRITE_CHUNK", 2)
    path = tmp_path / "five.jsonl"
    path.write_bytes(rows(5))
    written = []

    def refuse_at_the_end(report):
        assert Product.objects.count() == 8
        raise RuntimeError("undo")

    report = import_catalogue(path, on_progress=lambda report: written.append(report.rows_written))
    assert written[-3:] == [2, 4, 5]
    assert report.created == 5

    path.write_bytes(rows(3, start=5))
    with pytest.raises(RuntimeError):
        import_catalogue(path, before_commit=refuse_at_the_end)
    # All or nothing: what the writing pass wrote is rolled back.
    assert Product.objects.count() == 5


def test_the_interpreter_switches_threads_sooner_only_while_rows_are_read_ahead(tmp_path):
    path = tmp_path / "three.jsonl"
    path.write_bytes(rows(3))
    before = sys.getswitchinterval()
    during = []

    report = import_catalogue(path, on_progress=lambda report: during.append(sys.getswitchinterval()))

    assert report.created == 3
    # Python keeps the interval in whole microseconds.
    assert during and all(interval == pytest.approx(min(before, SWITCH_INTERVAL)) for interval in during)
    assert sys.getswitchinterval() == before


def test_a_file_is_read_once_and_what_was_read_is_what_is_imported(tmp_path):
    class EditedAfterReading(io.BytesIO):
        """Three good rows; should anything rewind it to read again, it finds the third broken."""

        def seek(self, offset: int, whence: int = 0, /) -> int:
            if self.tell():
                self.__init__(rows(2) + b"{oops\n")
            return super().seek(offset, whence)

    report = import_catalogue(EditedAfterReading(rows(3)))

    assert report.imported and report.created == 3 and not report.errors
    assert Product.objects.count() == 3


def test_a_report_lists_the_first_100_problems_and_counts_the_rest(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(rows(2) + b"{oops\n" * 150)

    report = import_catalogue(path)

    assert (report.rejected, report.error_count, len(report.errors)) == (150, 150, 100)
    assert report.errors[-1].line == 102
    assert report.unlisted_note == "… and 50 more rejected rows (only the first 100 are listed)"
    with pytest.raises(CommandError) as stopped:
        call_command("import_catalogue", str(path))
    message = str(stopped.value)
    assert "Nothing was imported: 150 rejected row(s)" in message
    assert message.count(": not valid JSON") == 100
    assert "line 102: not valid JSON" in message and "line 103" not in message
    assert message.endswith("… and 50 more rejected rows (only the first 100 are listed)")
    assert capsys.readouterr().out == "created 0, revised 0, unchanged 0, withdrawn 0, rejected 150\n"
    assert not Product.objects.exists()


# --- uploads imported by a worker -----------------------------------------------------------


def stored_upload(content: bytes, *, piece: int, name: str = "upload.jsonl", **extra) -> CatalogueImport:
    stored = CatalogueImport.objects.create(
        file_name=name, size=len(content), uploaded_by=UserFactory(roles=["catalogue_owner"]), **extra
    )
    for number, start in enumerate(range(0, len(content), piece)):
        CatalogueImportChunk.objects.create(
            catalogue_import=stored, number=number, data=content[start : start + piece]
        )
    return stored


def test_a_stored_upload_reads_back_line_by_line_across_its_chunks():
    big = json.dumps({"sku": "BIG-1", "title": "Big", "notes": ""}).encode()
    big = big.replace(b'""', b'"' + b"x" * (MAX_RECORD_BYTES - len(big)) + b'"')
    content = rows(3) + big + b"\r\n" + b"\n" + rows(2, start=3) + b'{"sku": "NO-END", "title": "Last"}'
    stored = stored_upload(content, piece=1000)

    from_chunks = list(read_catalogue(StoredFile(stored)))

    assert from_chunks == list(read_catalogue(io.BytesIO(content)))
    assert [row.sku for row in from_chunks] == [
        "S-000000",
        "S-000001",
        "S-000002",
        "BIG-1",
        "S-000003",
        "S-000004",
        "NO-END",
    ]
    reader = StoredFile(stored)
    assert reader.readline(5) == b'{"sku' and reader.readline(3) == b'": '
    reader.seek(0)
    assert reader.readline() == rows(1)


def test_the_worker_imports_an_upload_once_and_keeps_its_report():
    stored = stored_upload(rows(3) + b"{oops\n" + rows(1, start=3), piece=100, skip_invalid=True)

    assert import_catalogue_file(stored.pk) == ImportState.DONE
    assert import_catalogue_file(stored.pk) == "not claimed"

    stored.refresh_from_db()
    assert stored.state == ImportState.DONE and stored.imported and stored.finished_at
    assert stored.counts["created"] == 4 and stored.counts["rejected"] == 1
    assert (stored.rows_read, stored.rows_written, stored.error_count) == (5, 4, 1)
    assert stored.errors == [
        [4, "not valid JSON (Expecting property name enclosed in double quotes at column 2)", False]
    ]
    assert catalogue.report_of(stored).summary == "created 4, revised 0, unchanged 0, withdrawn 0, rejected 1"
    assert not stored.chunks.exists()  # the file's bytes are not kept once it is imported
    assert Product.objects.count() == 4


def test_a_refused_upload_writes_nothing_and_keeps_its_report():
    stored = stored_upload(b"sku,name\nA-1,Jar\n", piece=4, name="no-title.csv")

    assert import_catalogue_file(stored.pk) == ImportState.DONE

    stored.refresh_from_db()
    assert not stored.imported
    report = catalogue.report_of(stored)
    assert report.unreadable and [str(error) for error in report.errors] == [
        "line 1: the header must name the columns sku and title (missing: title)"
    ]
    assert not Product.objects.exists()


def test_a_running_import_is_left_to_its_worker_unless_that_worker_fell_silent():
    stored = stored_upload(rows(2), piece=50)
    recent = timezone.now() - timedelta(minutes=1)
    CatalogueImport.objects.filter(pk=stored.pk).update(
        state=ImportState.RUNNING, claimed_by="alive", progress_at=recent
    )

    assert import_catalogue_file(stored.pk) == "not claimed"
    assert not Product.objects.exists()

    silent = timezone.now() - catalogue.IMPORT_STALE_AFTER - timedelta(seconds=1)
    CatalogueImport.objects.filter(pk=stored.pk).update(progress_at=silent)
    assert import_catalogue_file(stored.pk) == ImportState.DONE
    assert Product.objects.count() == 2


def test_a_worker_whose_claim_was_taken_over_commits_nothing(monkeypatch):
    stored = stored_upload(rows(2), piece=50)
    real_import = uploads.import_catalogue

    def taken_over_while_writing(source, **options):
        def steal_then_finish(report):
            CatalogueImport.objects.filter(pk=stored.pk).update(claimed_by="another")
            options["before_commit"](report)

        return real_import(source, **{**options, "before_commit": steal_then_finish})

    monkeypatch.setattr(uploads, "import_catalogue", taken_over_while_writing)

    assert import_catalogue_file(stored.pk) == "taken over"
    assert not Product.objects.exists()
    assert CatalogueImport.objects.get(pk=stored.pk).state == ImportState.RUNNING


def test_an_unexpected_error_fails_the_import_and_says_so(monkeypatch):
    stored = stored_upload(rows(2), piece=50)
    # Any error while writing (new products are merged set-wise, not one record_product at a time).
    monkeypatch.setattr(importing, "write_chunk", lambda chunk, report: 1 / 0)

    assert import_catalogue_file(stored.pk) == ImportState.FAILED

    stored.refresh_from_db()
    assert stored.state == ImportState.FAILED and "nothing was imported" in stored.failure
    assert not Product.objects.exists() and not stored.chunks.exists()


def test_the_command_reads_a_path_and_the_sample_still_imports(tmp_path: Path, capsys):
    path = tmp_path / "a.jsonl"
    path.write_bytes(rows(3))
    call_command("import_catalogue", str(path))
    call_command("import_catalogue", str(path))
    assert capsys.readouterr().out.splitlines() == [
        "created 3, revised 0, unchanged 0, withdrawn 0, rejected 0",
        "created 0, revised 0, unchanged 3, withdrawn 0, rejected 0",
    ]
