"""Importing a catalogue file, in one transaction (SPEC §7).

Importing is all or nothing unless the caller asks to skip invalid rows: a rejected file leaves the
ledger exactly as it was. Memory stays bounded whatever the file's size. The file is read once, a
record at a time: rows are checked and, a chunk at a time, staged in a temporary table and merged
set-wise (`merging`); a file on disk is read a chunk or two ahead in a thread of its own while the
database merges (`_ReadAhead`). Rejected rows that stop the import roll back what was written
meanwhile, and the rest of the file is only checked. One import writes at a time.
"""

import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack

from django.db import connection, transaction

from ..database.table_statistics import analyse_after_bulk_change
from ..models import (
    Product,
    SourceRevision,
)
from ..workers.cycles import fewer_cycle_collections
from ..workers.thread_switching import quicker_thread_switches
from .digests import KnownLines, LineNotRecognised, may_recognise
from .merging import Chunk, staging_table, write_chunk
from .reading import CountingReader, StoredFile, opened, stage_rows
from .records import BinaryLines, CatalogueSource, ImportReport, Rejection, Staged, Unreadable
from .rework import price_rework

# Records written per chunk of the second pass, and at most this many bytes of them in memory.
_WRITE_CHUNK = 5000
# The first chunk is a fifth of the others: the database waits for it alone before it starts
# writing, while the reader reads on (a full first chunk left it idle for a tenth of a 50,000-row
# import). Chunks set under _RAMP_FROM rows are kept as set.
_FIRST_SHARE = 5
_RAMP_FROM = 100


_WRITE_CHUNK_BYTES = 16 * 1024 * 1024


# Progress is reported after this many rows; the reader runs at most this many chunks ahead.
_PROGRESS_ROWS = 1000


_READ_AHEAD = 2


# The key of PostgreSQL's advisory lock that lets one import write at a time, and how often an
# import waiting for it asks again.
IMPORT_LOCK = 7_420_001


_LOCK_WAIT_SECONDS = 0.5


class _Refused(Exception):
    """Rejected rows stop the import: everything it wrote is rolled back."""


def import_catalogue(
    source: CatalogueSource,
    *,
    skip_invalid: bool = False,
    replace: bool = False,
    dry_run: bool = False,
    on_progress: Callable[[ImportReport], None] | None = None,
    before_commit: Callable[[ImportReport], None] | None = None,
    recognise_lines: bool = True,
) -> ImportReport:
    """Create and revise products from a catalogue file, in one transaction.

    A file changes only what it names (SPEC §7): a field a record does not name is left as it is on
    an existing product; a named field with a blank value (an empty cell, "", null) is removed.
    With `replace`, each record is the product's whole content. Any rejected row stops the whole
    import unless `skip_invalid`, in which case the valid rows are imported and the others counted
    as rejected. Products missing from the file are left alone; a row without a status leaves an
    existing product's status alone.

    A `dry_run` does all of it in its transaction, reports what it did (revisions and their fields,
    the unfinished jobs' items stopped and queued again, with their estimated cost), and rolls back:
    nothing changes.

    `source` is a path or a binary file-like object (left open). `on_progress` is told how far
    the import has come now and then; `before_commit` is called inside the transaction once
    every row is written, and may raise to undo the whole import (`DryRun`: and keep its report).
    Without `recognise_lines`, no line is looked up among the lines products were made from (reading
    their digests costs more than a file of a line or two saves).
    """
    options = {"skip_invalid": skip_invalid, "replace": replace, "dry_run": dry_run}
    with opened(source) as (stream, name):
        try:
            report = _import(stream, name, on_progress, before_commit, recognise=recognise_lines, **options)
        except LineNotRecognised:
            # A product changed between reading the lines it had and meeting one of them: rare,
            # and the import was rolled back. Once more, reading every line.
            stream.seek(0)
            report = _import(stream, name, on_progress, before_commit, recognise=False, **options)
    if report.imported:
        new_revisions = report.created + report.revised
        changed = new_revisions + report.withdrawn + report.reactivated
        analyse_after_bulk_change({Product: changed, SourceRevision: new_revisions})
    return report


class DryRun(Exception):
    """Raised inside an import's transaction: everything is rolled back and the report kept, as a
    dry run's."""


def _import(
    stream: BinaryLines,
    name: str,
    on_progress: Callable[[ImportReport], None] | None,
    before_commit: Callable[[ImportReport], None] | None,
    *,
    skip_invalid: bool,
    replace: bool,
    dry_run: bool,
    recognise: bool,
) -> ImportReport:
    report = ImportReport(replace=replace, dry_run=dry_run)
    counted = CountingReader(stream)
    try:
        with fewer_cycle_collections(), transaction.atomic():
            _one_import_at_a_time(waiting=(lambda: on_progress(report)) if on_progress else None)
            known = KnownLines.load() if recognise and may_recognise(name) else None
            chunks = _chunks(counted, name=name, report=report, skip_invalid=skip_invalid, known=known)
            with (
                staging_table(),
                _ReadAhead(chunks, threaded=not isinstance(stream, StoredFile)) as rows,
            ):
                for chunk in rows:
                    if chunk:
                        write_chunk(chunk, report)
                    if on_progress:
                        on_progress(report)
            if report.stops(skip_invalid):
                raise _Refused
            price_rework(report)
            if dry_run:
                raise DryRun
            report.imported = True
            if before_commit:
                before_commit(report)
    except _Refused:
        report.nothing_written()
    except DryRun:
        report.imported, report.dry_run = False, True
    return report


def _one_import_at_a_time(waiting: Callable[[], None] | None = None) -> None:
    """Imports lock products chunk by chunk in file order, so two at once could each wait for a
    product the other holds. The second waits for the first to commit instead (SQLite lets one
    transaction write at a time anyway), calling `waiting` now and then: a worker's import shows
    it is alive (the first may take an hour), and ends there if its cluster is stopping."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            while True:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [IMPORT_LOCK])
                if cursor.fetchone()[0]:
                    return
                if waiting:
                    waiting()
                time.sleep(_LOCK_WAIT_SECONDS)


def _chunks(
    stream: "CountingReader",
    *,
    name: str,
    report: ImportReport,
    skip_invalid: bool,
    known: "KnownLines | None" = None,
) -> Iterator["Chunk"]:
    """The file's rows, read, checked and hashed: chunks of at most `_WRITE_CHUNK` rows (the first,
    a fifth of it) and `_WRITE_CHUNK_BYTES` of content, and, once the problems found stop the import
    and rows are only checked, an empty one now and then, so the caller can report progress."""
    rows = _WRITE_CHUNK // _FIRST_SHARE if _WRITE_CHUNK >= _RAMP_FROM else _WRITE_CHUNK
    chunk, size = Chunk(), 0
    for row in stage_rows(stream, name=name, known=known, keep_fields=False):
        report.rows_read += not isinstance(row, Unreadable)
        if isinstance(row, Rejection):
            report.add_error(row)
        elif not report.stops(skip_invalid):
            chunk.append(row)
            if isinstance(row, Staged):
                size += len(row.fields) + len(row.record.title)
        # A full chunk; or now and then, while rows are only checked, an empty one for progress.
        if (
            len(chunk) >= rows
            or size >= _WRITE_CHUNK_BYTES
            or (not chunk and report.rows_read % _PROGRESS_ROWS == 0)
        ):
            report.checked_bytes = stream.bytes_read
            yield chunk
            chunk, size, rows = Chunk(), 0, _WRITE_CHUNK
    report.checked_bytes = stream.bytes_read
    if chunk:
        yield chunk


class _ReadAhead:
    """Runs `_chunks` in a thread of its own, up to `_READ_AHEAD` chunks ahead of the writer, so the
    database merges one chunk while Python reads the next: two cores at work instead of one taking
    turns. Only for a file on disk: the thread touches no database (an upload is read back from the
    database, in the writer's transaction, so it is read in the writer's thread).

    While the reader runs, Python hands the interpreter to the writer sooner
    (`quicker_thread_switches`): the writer needs it each time the database has answered."""

    _END = object()

    def __init__(self, chunks: Iterator["Chunk"], *, threaded: bool):
        self.chunks, self.threaded = chunks, threaded
        self.queue: queue.Queue = queue.Queue(maxsize=_READ_AHEAD)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._read, name="catalogue-reader", daemon=True)
        self.switching = ExitStack()

    def __enter__(self) -> "_ReadAhead":
        if self.threaded:
            self.switching.enter_context(quicker_thread_switches())
            self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.threaded:
            self.stopping.set()
            self.thread.join()
            self.switching.close()

    def __iter__(self) -> Iterator["Chunk"]:
        if not self.threaded:
            yield from self.chunks
            return
        while (chunk := self.queue.get()) is not self._END:
            if isinstance(chunk, BaseException):
                raise chunk
            yield chunk

    def _put(self, item: object) -> bool:
        while not self.stopping.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _read(self) -> None:
        try:
            for chunk in self.chunks:
                if not self._put(chunk.prepare()):
                    return
            self._put(self._END)
        except BaseException as error:  # handed to the writer, who raises it
            self._put(error)
