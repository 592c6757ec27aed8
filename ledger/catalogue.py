"""Catalogue files (SPEC §7): read JSONL or CSV into checked records, then import them.

A file is read in binary and decoded line by line, so a record that is not UTF-8, too large or
malformed is reported with the physical line it starts on. Importing is all or nothing unless
the caller asks to skip invalid rows: a rejected file leaves the ledger exactly as it was.

Memory stays bounded whatever the file's size. The file is read once, a record at a time, in one
transaction: rows are checked and, a chunk at a time, staged in a temporary table and merged
set-wise (`_write`); a file on disk is read a chunk or two ahead in a thread of its own while the
database merges (`_ReadAhead`). Rejected rows that stop the import roll back what was written
meanwhile, and the rest of the file is only checked. A usual JSONL row is read and checked in a
few C calls (`_usual_row`); anything unusual is read and worded in full. A report keeps the first
100 problems and counts the others.
The one thing that grows with the file is finding a SKU repeated anywhere in it: at most 32
bytes a SKU (`_SeenSkus`); and with the catalogue, the digests of the lines that made its products
(`_KnownLines`, 24 bytes a product).
"""

import csv
import hashlib
import json
import logging
import math
import os
import queue
import re
import secrets
import sys
import threading
import time
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from itertools import chain
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import NamedTuple, NoReturn, Protocol

import jiter
import orjson
import psycopg
from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.db import connection, connections, transaction
from django.db.models import Q
from django.utils import timezone
from django_q.tasks import async_task

from .actions import record_product
from .cycles import fewer_cycle_collections
from .json_values import (
    MAX_FIELD_DEPTH,
    FieldValue,
    InvalidJson,
    json_value_problem,
    refuse_json_constant,
    shown,
    text_problem,
    unique_json_keys,
)
from .models import (
    CatalogueImport,
    CatalogueImportChunk,
    ImportState,
    Item,
    Product,
    ProductStatus,
    SourceRevision,
)
from .setwise import (
    PackedArray,
    insert_from_select,
    insert_select_sql,
    next_id_sql,
    packed_bytes,
    packed_ints,
    packed_texts,
    with_packed_arrays,
)
from .states import ItemState, sources_for
from .stopping import stop_asked
from .table_statistics import analyse_after_bulk_change
from .thread_switching import quicker_thread_switches

log = logging.getLogger(__name__)

MAX_RECORD_BYTES = 65536
MAX_TITLE_LENGTH = 300
SKU_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SKU_RULE = "letters, digits, . _ - ; at most 64"
# A report (on the screen, from the command) lists this many problems and counts the rest.
MAX_REPORTED_ERRORS = 100

# Enough to tell a line that is exactly at the limit (plus CR LF) from one that is over it.
_READ_LIMIT = MAX_RECORD_BYTES + 3
_BOM = b"\xef\xbb\xbf"
# A file on disk is read this much at a time.
_FILE_BUFFER_BYTES = 1024 * 1024
# Records written per chunk of the second pass, and at most this many bytes of them in memory.
_WRITE_CHUNK = 5000
_WRITE_CHUNK_BYTES = 16 * 1024 * 1024
# Progress is reported after this many rows; the reader runs at most this many chunks ahead.
_PROGRESS_ROWS = 1000
_READ_AHEAD = 2
# The key of PostgreSQL's advisory lock that lets one import write at a time, and how often an
# import waiting for it asks again.
_IMPORT_LOCK = 7_420_001
_LOCK_WAIT_SECONDS = 0.5


class BinaryLines(Protocol):
    """Anything read in binary a line at a time and rewound: an open file, BytesIO, a Django
    UploadedFile, a stored upload."""

    def readline(self, size: int = -1, /) -> bytes: ...

    def seek(self, offset: int, whence: int = 0, /) -> int: ...


type CatalogueSource = str | os.PathLike[str] | BinaryLines


class Record(NamedTuple):
    line: int
    sku: str
    title: str
    status: str | None
    fields: dict[str, FieldValue]


class Rejection(NamedTuple):
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class _Refused(Exception):
    """Rejected rows stop the import: everything it wrote is rolled back."""


class Unreadable(Rejection):
    """The file as a whole cannot be read (a CSV header without sku or title, say)."""


@dataclass
class ImportReport:
    """What an import did. `imported` is False when nothing was written at all.

    Each product is counted by what happened to it: `created` (new, whatever its status),
    `revised` (new source revision), `withdrawn` (status changed to withdrawn), `reactivated`
    (withdrawn before, active now) or `unchanged` (same content, same status). A row that both
    changes the content and withdraws the product counts as revised and as withdrawn.
    """

    created: int = 0
    revised: int = 0
    unchanged: int = 0
    withdrawn: int = 0
    reactivated: int = 0
    rejected: int = 0
    # The first MAX_REPORTED_ERRORS problems, and how many there are in all.
    errors: list[Rejection] = field(default_factory=list)
    error_count: int = 0
    imported: bool = False
    # Progress: rows (and bytes) the first pass has checked, rows the second has written.
    rows_read: int = 0
    checked_bytes: int = 0
    rows_written: int = 0
    # Unchanged rows recognised by their line alone (met before, see `_KnownLines`).
    recognised: int = 0

    @property
    def summary(self) -> str:
        return (
            f"created {self.created}, revised {self.revised}, unchanged {self.unchanged}, "
            f"withdrawn {self.withdrawn}, rejected {self.rejected}"
        )

    @property
    def unlisted_errors(self) -> int:
        return self.error_count - len(self.errors)

    @property
    def unlisted_note(self) -> str:
        count = self.unlisted_errors
        return f"… and {count} more rejected row{'s' if count != 1 else ''} (only the first {MAX_REPORTED_ERRORS} are listed)"

    @property
    def unreadable(self) -> bool:
        return bool(self.errors) and isinstance(self.errors[0], Unreadable)

    def stops(self, skip_invalid: bool) -> bool:
        """Whether the problems found so far stop the import: nothing of it will be kept."""
        return self.unreadable or bool(self.rejected and not skip_invalid)

    def nothing_written(self) -> None:
        """The import was rolled back: what it wrote meanwhile does not count."""
        self.created = self.revised = self.unchanged = self.withdrawn = self.reactivated = 0
        self.rows_written = self.recognised = 0

    def add_error(self, error: Rejection) -> None:
        self.error_count += 1
        self.rejected += not isinstance(error, Unreadable)
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append(error)


class _Line(NamedTuple):
    number: int
    # Decoded text ending in "\n" (what the csv module reads); "\n" alone when unreadable.
    text: str
    size: int
    problem: str | None
    # `line_digest` of the line's bytes, when the import recognises lines (see _KnownLines).
    digest: bytes | None = None


def import_catalogue(
    source: CatalogueSource,
    *,
    skip_invalid: bool = False,
    on_progress: Callable[[ImportReport], None] | None = None,
    before_commit: Callable[[ImportReport], None] | None = None,
) -> ImportReport:
    """Create and revise products from a catalogue file, in one transaction.

    Any rejected row stops the whole import unless `skip_invalid`, in which case the valid
    rows are imported and the others counted as rejected. Products missing from the file are
    left alone; a row without a status leaves an existing product's status alone.

    `source` is a path or a binary file-like object (left open). `on_progress` is told how far
    the import has come now and then; `before_commit` is called inside the transaction once
    every row is written, and may raise to undo the whole import.
    """
    with _opened(source) as (stream, name):
        try:
            report = _import(stream, name, skip_invalid, on_progress, before_commit, recognise=True)
        except _LineNotRecognised:
            # A product changed between reading the lines it had and meeting one of them: rare,
            # and the import was rolled back. Once more, reading every line.
            stream.seek(0)
            report = _import(stream, name, skip_invalid, on_progress, before_commit, recognise=False)
    if report.imported:
        new_revisions = report.created + report.revised
        changed = new_revisions + report.withdrawn + report.reactivated
        analyse_after_bulk_change({Product: changed, SourceRevision: new_revisions})
    return report


def _import(
    stream: BinaryLines,
    name: str,
    skip_invalid: bool,
    on_progress: Callable[[ImportReport], None] | None,
    before_commit: Callable[[ImportReport], None] | None,
    *,
    recognise: bool,
) -> ImportReport:
    report = ImportReport()
    counted = _CountingReader(stream)
    try:
        with fewer_cycle_collections(), transaction.atomic():
            _one_import_at_a_time(waiting=(lambda: on_progress(report)) if on_progress else None)
            known = _KnownLines.load() if recognise and _may_recognise(name) else None
            chunks = _chunks(counted, name=name, report=report, skip_invalid=skip_invalid, known=known)
            with (
                _staging_table(),
                _ReadAhead(chunks, threaded=not isinstance(stream, StoredFile)) as rows,
            ):
                for chunk in rows:
                    if chunk:
                        _write(chunk, report)
                    if on_progress:
                        on_progress(report)
            if report.stops(skip_invalid):
                raise _Refused
            report.imported = True
            if before_commit:
                before_commit(report)
    except _Refused:
        report.nothing_written()
    return report


def read_catalogue(source: CatalogueSource) -> Iterator[Record | Rejection]:
    """Read and check a catalogue file, row by row in file order; nothing is written.

    The format comes from the name (`.jsonl`/`.json`, `.csv`); otherwise a first non-blank
    character `{` means JSONL. An `Unreadable` ends the rows.
    """
    with _opened(source) as (stream, name):
        for row in _read(stream, name=name):
            yield row if isinstance(row, Rejection) else row.record


@contextmanager
def _opened(source: CatalogueSource) -> Iterator[tuple[BinaryLines, str]]:
    if isinstance(source, str | os.PathLike):
        # Read a megabyte at a time: each read is a system call that hands the interpreter to the
        # writing thread and back. An unchanged re-import of 100,000 products took 1.0 s reading
        # 8 KB at a time (the default) and 0.7 s reading a megabyte.
        with open(source, "rb", buffering=_FILE_BUFFER_BYTES) as stream:
            yield stream, os.fspath(source)
    else:
        source.seek(0)
        yield source, str(getattr(source, "name", "") or "")


class _CountingReader:
    def __init__(self, stream: BinaryLines) -> None:
        self.stream = stream
        self.bytes_read = 0

    def readline(self, size: int = -1, /) -> bytes:
        line = self.stream.readline(size)
        self.bytes_read += len(line)
        return line


def _one_import_at_a_time(waiting: Callable[[], None] | None = None) -> None:
    """Imports lock products chunk by chunk in file order, so two at once could each wait for a
    product the other holds. The second waits for the first to commit instead (SQLite lets one
    transaction write at a time anyway), calling `waiting` now and then: a worker's import shows
    it is alive (the first may take an hour), and ends there if its cluster is stopping."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            while True:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_IMPORT_LOCK])
                if cursor.fetchone()[0]:
                    return
                if waiting:
                    waiting()
                time.sleep(_LOCK_WAIT_SECONDS)


# The second pass stages each chunk in a temporary table of this connection, then merges it.
_STAGING = "bd_catalogue_staging"
_KNOWN = "bd_catalogue_known"
# The staged rows beside their products as they were (old_status null: a new product).
_ROWS = f"{_STAGING} s JOIN {_KNOWN} k ON k.sku = s.sku"
_PRODUCTS = Product._meta.db_table
_REVISIONS = SourceRevision._meta.db_table
_ITEMS = Item._meta.db_table
# A staged row whose product exists: its content differs from the current revision's / it withdraws.
_REVISED = "COALESCE(k.old_hash, '') <> s.content_hash"
_WITHDRAWING = (
    f"COALESCE(s.status, '') = '{ProductStatus.WITHDRAWN}' AND k.old_status <> '{ProductStatus.WITHDRAWN}'"
)
_REACTIVATING = (
    f"k.old_status = '{ProductStatus.WITHDRAWN}' AND COALESCE(s.status, '') = '{ProductStatus.ACTIVE}'"
)
# Items a revision or a withdrawal may stop (`stop_unapplied_items`): a product with one of these
# is written by `record_product`, so they are judged exactly as when a product is revised alone.
_STOPPABLE_STATES = sources_for(ItemState.WITHDRAWN) | sources_for(ItemState.OBSOLETE)


@contextmanager
def _staging_table() -> Iterator[None]:
    """Created inside the import's transaction, so a rolled-back import leaves none behind. `_KNOWN`
    holds, for each staged row, its product as it was before the chunk (none: a new product)."""
    fields, digest = ("jsonb", "bytea") if connection.vendor == "postgresql" else ("text", "blob")
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TEMPORARY TABLE {_STAGING} (line integer NOT NULL, sku varchar(64) NOT NULL, "
            f"title text NOT NULL, fields {fields} NOT NULL, content_hash varchar(64) NOT NULL, "
            f"status varchar(16), line_digest {digest})"
        )
        cursor.execute(
            f"CREATE TEMPORARY TABLE {_KNOWN} (sku varchar(64) NOT NULL, product_id bigint NOT NULL, "
            "old_status varchar(16), old_number integer, old_hash varchar(64), old_revision_id bigint, "
            "new_revision_id bigint)"
        )
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {_STAGING}")
        cursor.execute(f"DROP TABLE {_KNOWN}")


class _Staged(NamedTuple):
    record: Record  # its fields None when read for an import (`_read`): written from `fields`
    fields: str  # JSON
    content_hash: str
    line_digest: bytes | None = None  # when the import recognises lines: the line's


class _Recognised(NamedTuple):
    """A line met before: the one that made its product what it is now. Nothing to write."""

    line: int
    product_id: int
    digest: bytes


def _staged(row: Record | Rejection, keep_fields: bool = True) -> "_Staged | Rejection":
    if isinstance(row, Rejection):
        return row
    # The hash is record_product's own, so a product staged here and one recorded alone agree.
    content_hash = SourceRevision.hash_content(row.title, row.fields)
    return _Staged(row if keep_fields else row._replace(fields=None), json.dumps(row.fields), content_hash)


def _chunks(
    stream: "_CountingReader",
    *,
    name: str,
    report: ImportReport,
    skip_invalid: bool,
    known: "_KnownLines | None" = None,
) -> Iterator["_Chunk"]:
    """The file's rows, read, checked and hashed: chunks of at most `_WRITE_CHUNK` rows and
    `_WRITE_CHUNK_BYTES` of content, and, once the problems found stop the import and rows are only
    checked, an empty one now and then, so the caller can report progress."""
    chunk, size = _Chunk(), 0
    for row in _read(stream, name=name, known=known, keep_fields=False):
        report.rows_read += not isinstance(row, Unreadable)
        if isinstance(row, Rejection):
            report.add_error(row)
        elif not report.stops(skip_invalid):
            chunk.append(row)
            if isinstance(row, _Staged):
                size += len(row.fields) + len(row.record.title)
        # A full chunk; or now and then, while rows are only checked, an empty one for progress.
        if (
            len(chunk) >= _WRITE_CHUNK
            or size >= _WRITE_CHUNK_BYTES
            or (not chunk and report.rows_read % _PROGRESS_ROWS == 0)
        ):
            report.checked_bytes = stream.bytes_read
            yield chunk
            chunk, size = _Chunk(), 0
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

    def __init__(self, chunks: Iterator["_Chunk"], *, threaded: bool):
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

    def __iter__(self) -> Iterator["_Chunk"]:
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


def _stage(cursor, chunk: list[_Staged]) -> None:
    rows = (
        (
            staged.record.line,
            staged.record.sku,
            staged.record.title,
            staged.fields,
            staged.content_hash,
            staged.record.status,
            staged.line_digest,
        )
        for staged in chunk
    )
    columns = "line, sku, title, fields, content_hash, status, line_digest"
    if connection.vendor == "postgresql":
        with cursor.copy(f"COPY {_STAGING} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
    else:
        cursor.executemany(f"INSERT INTO {_STAGING} ({columns}) VALUES (%s, %s, %s, %s, %s, %s, %s)", rows)


def _merge(cursor, report: ImportReport) -> None:
    """The staged rows whose products have no items to judge, in a few statements."""
    cursor.execute(
        f"SELECT COUNT(*) - COUNT(k.sku), "
        f"COALESCE(SUM(CASE WHEN k.sku IS NOT NULL AND {_REVISED} THEN 1 ELSE 0 END), 0), "
        f"COALESCE(SUM(CASE WHEN {_WITHDRAWING} THEN 1 ELSE 0 END), 0), "
        f"COALESCE(SUM(CASE WHEN {_REACTIVATING} THEN 1 ELSE 0 END), 0), "
        f"COALESCE(SUM(CASE WHEN k.sku IS NOT NULL AND NOT ({_REVISED}) AND NOT ({_WITHDRAWING}) "
        f"AND NOT ({_REACTIVATING}) "
        f"THEN 1 ELSE 0 END), 0) FROM {_STAGING} s LEFT JOIN {_KNOWN} k ON k.sku = s.sku"
    )
    created, revised, withdrawn, reactivated, unchanged = cursor.fetchone()
    report.created += created
    report.revised += revised
    report.withdrawn += withdrawn
    report.reactivated += reactivated
    report.unchanged += unchanged
    now = timezone.now()
    if connection.vendor == "postgresql":
        _write_revisions_with_their_ids(cursor, created=created, revised=revised, now=now)
    else:
        _write_revisions(cursor, created=created, revised=revised, now=now)
    if withdrawn or reactivated:
        cursor.execute(
            f"UPDATE {_PRODUCTS} SET status = s.status, line_digest = s.line_digest, updated_at = %s "
            f"FROM {_ROWS} WHERE {_PRODUCTS}.id = k.product_id AND NOT ({_REVISED}) "
            f"AND s.status IS NOT NULL AND s.status <> {_PRODUCTS}.status",
            [now],
        )
    if unchanged:
        # A line that changes nothing, met for the first time since its product last changed: the
        # next import recognises it. Only if the product is still as compared (it is not locked).
        cursor.execute(
            f"UPDATE {_PRODUCTS} SET line_digest = s.line_digest FROM {_ROWS} "
            f"WHERE {_PRODUCTS}.id = k.product_id AND s.line_digest IS NOT NULL "
            f"AND {_PRODUCTS}.line_digest IS DISTINCT FROM s.line_digest "
            f"AND {_PRODUCTS}.current_revision_id = k.old_revision_id AND {_PRODUCTS}.status = k.old_status "
            f"AND NOT ({_REVISED}) AND NOT ({_WITHDRAWING}) AND NOT ({_REACTIVATING})"
        )


# The staged rows of new products.
_NEW = f"{_STAGING} s WHERE NOT EXISTS (SELECT 1 FROM {_KNOWN} k WHERE k.sku = s.sku)"


def _write_revisions_with_their_ids(cursor, *, created: int, revised: int, now) -> None:
    """New products and new revisions, each row written once: a revision's id is taken from its
    sequence before it is written, so a new product is created already pointing at its first
    revision, in the statement that writes that revision (PostgreSQL checks both references at
    the statement's end, migration 0023), and a revised one is updated once."""
    next_id = next_id_sql(SourceRevision)
    if created:
        products, revisions = _created_sql(f"{_NEW} ORDER BY s.sku")
        cursor.execute(f"WITH {products[0]} {revisions}", [*products[1], now])
    if revised:
        cursor.execute(
            f"UPDATE {_KNOWN} k SET new_revision_id = {next_id} FROM {_STAGING} s "
            f"WHERE k.sku = s.sku AND k.old_status IS NOT NULL AND {_REVISED}"
        )
        cursor.execute(
            f"INSERT INTO {_REVISIONS} (id, product_id, number, title, fields, content_hash, created_at) "
            f"SELECT k.new_revision_id, k.product_id, COALESCE(k.old_number, 0) + 1, s.title, s.fields, "
            f"s.content_hash, %s FROM {_ROWS} WHERE k.new_revision_id IS NOT NULL ORDER BY s.sku",
            [now],
        )
        # The status too, so the line's digest is written by the one statement that changes both.
        cursor.execute(
            f"UPDATE {_PRODUCTS} SET current_revision_id = k.new_revision_id, "
            f"status = COALESCE(s.status, {_PRODUCTS}.status), line_digest = s.line_digest, updated_at = %s "
            f"FROM {_ROWS} WHERE {_PRODUCTS}.id = k.product_id AND k.old_status IS NOT NULL "
            f"AND k.new_revision_id IS NOT NULL",
            [now],
        )


def _write_revisions(cursor, *, created: int, revised: int, now) -> None:
    """`_write_revisions_with_their_ids` on SQLite, which has no sequences: new products first,
    then every new revision, then the products pointed at them."""
    if created:
        insert_from_select(
            Product,
            select={"sku": "s.sku", "status": f"COALESCE(s.status, '{ProductStatus.ACTIVE}')"},
            from_sql=f"{_NEW} ORDER BY s.sku",
        )
        cursor.execute(
            f"INSERT INTO {_KNOWN} (sku, product_id) SELECT p.sku, p.id FROM {_PRODUCTS} p "
            f"WHERE p.sku IN (SELECT s.sku FROM {_NEW})"
        )
    if created or revised:
        insert_from_select(
            SourceRevision,
            select={
                "product": "k.product_id",
                "number": "COALESCE(k.old_number, 0) + 1",
                "title": "s.title",
                "fields": "s.fields",
                "content_hash": "s.content_hash",
            },
            from_sql=f"{_ROWS} WHERE {_REVISED} ORDER BY s.sku",
        )
        cursor.execute(
            f"UPDATE {_PRODUCTS} SET current_revision_id = r.id, status = COALESCE(s.status, {_PRODUCTS}.status), "
            f"line_digest = s.line_digest, updated_at = %s FROM {_ROWS} "
            f"JOIN {_REVISIONS} r ON r.product_id = k.product_id AND r.number = COALESCE(k.old_number, 0) + 1 "
            f"WHERE {_PRODUCTS}.id = k.product_id AND {_REVISED}",
            [now],
        )


def _lock_the_changed(cursor) -> None:
    """Lock the chunk's products that will change, in SKU order as any other writer of several
    products does, and read them again as they are now. An unchanged row writes nothing and locks
    nothing: should another writer change its product meanwhile, the import came first."""
    cursor.execute(
        f"SELECT p.id FROM {_PRODUCTS} p JOIN {_ROWS} ON k.product_id = p.id "
        f"WHERE {_REVISED} OR {_WITHDRAWING} OR {_REACTIVATING} ORDER BY p.sku FOR UPDATE OF p"
    )
    locked = [product_id for (product_id,) in cursor.fetchall()]
    if locked:
        cursor.execute(
            f"UPDATE {_KNOWN} SET old_status = p.status, old_number = r.number, old_hash = r.content_hash, "
            f"old_revision_id = p.current_revision_id "
            f"FROM {_PRODUCTS} p LEFT JOIN {_REVISIONS} r ON r.id = p.current_revision_id "
            f"WHERE p.id = {_KNOWN}.product_id AND p.id = ANY(%s)",
            [locked],
        )


def _write(chunk: "_Chunk", report: ImportReport) -> None:
    """Write one chunk: recognised lines are confirmed in one query and write nothing; the other
    rows are staged and merged."""
    recognised = [row for row in chunk if isinstance(row, _Recognised)]
    if recognised:
        _confirm(recognised)
        report.unchanged += len(recognised)
        report.recognised += len(recognised)
        report.rows_written += len(recognised)
    staged = chunk.prepare().staged
    if staged:
        _write_staged(staged, report)


def _confirm(recognised: list["_Recognised"]) -> None:
    """Each recognised line's product still has that line's digest (the digest is cleared whenever
    the product changes otherwise); if one does not, the import starts again reading every line.
    The products are read by their keys (an index scan however fresh the table's statistics) and
    compared here."""
    # Ids sent packed in binary, digests read as bytes.
    with with_packed_arrays(psycopg.Cursor(connection.connection)) as cursor:
        cursor.execute(
            f"SELECT id, line_digest FROM {_PRODUCTS} WHERE id = ANY(%b::bigint[])",
            [packed_ints([row.product_id for row in recognised])],
            binary=True,
        )
        digests = dict(cursor.fetchall())
    if any(digests.get(row.product_id) != row.digest for row in recognised):
        raise _LineNotRecognised


def _write_staged(chunk: list[_Staged], report: ImportReport) -> None:
    """Stage the rows, then a few statements create the new products and their first revisions,
    add a revision where the content hash changed and change statuses. A row the database finds
    unchanged writes nothing but its line's digest. A revised or withdrawn product with items that
    may have to stop goes through `record_product`, which judges them (rare in a bulk import)."""
    if connection.vendor == "postgresql" and _created_if_all_new(chunk):
        report.created += len(chunk)
        report.rows_written += len(chunk)
        return
    records = {staged.record.sku: staged for staged in chunk}
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"TRUNCATE {_STAGING}, {_KNOWN}")  # cheaper than deleting every row
        else:
            cursor.execute(f"DELETE FROM {_STAGING}")
            cursor.execute(f"DELETE FROM {_KNOWN}")
        _stage(cursor, chunk)
        cursor.execute(
            f"INSERT INTO {_KNOWN} (sku, product_id, old_status, old_number, old_hash, old_revision_id) "
            f"SELECT p.sku, p.id, p.status, r.number, r.content_hash, p.current_revision_id FROM {_PRODUCTS} p "
            f"LEFT JOIN {_REVISIONS} r ON r.id = p.current_revision_id "
            f"WHERE p.sku IN (SELECT sku FROM {_STAGING})"
        )
        if connection.vendor == "postgresql":
            _lock_the_changed(cursor)
        stopping = sorted(_STOPPABLE_STATES)
        cursor.execute(
            f"SELECT s.sku, k.old_status FROM {_ROWS} WHERE ({_REVISED} OR {_WITHDRAWING}) "
            f"AND EXISTS (SELECT 1 FROM {_ITEMS} i WHERE i.product_id = k.product_id "
            f"AND i.state IN ({', '.join(['%s'] * len(stopping))})) ORDER BY s.sku",
            stopping,
        )
        one_by_one = cursor.fetchall()
        for sku, before in one_by_one:
            staged = records[sku]
            record = staged.record
            fields = json.loads(staged.fields)
            change = record_product(sku=sku, title=record.title, fields=fields, status=record.status)
            reactivated = before == ProductStatus.WITHDRAWN and record.status == ProductStatus.ACTIVE
            report.revised += change.revised
            report.withdrawn += change.withdrawn
            report.reactivated += reactivated
            report.unchanged += not (change.revised or change.withdrawn or reactivated)
        if one_by_one:
            skus = [sku for sku, _ in one_by_one]
            cursor.execute(f"DELETE FROM {_STAGING} WHERE sku IN ({', '.join(['%s'] * len(skus))})", skus)
        _merge(cursor, report)
    report.rows_written += len(chunk)


def _created_if_all_new(chunk: list[_Staged]) -> bool:
    """A chunk none of whose SKUs is a product yet, as every chunk of a first import: its products
    and their first revisions are written by one statement, from the rows sent as six arrays
    (packed in binary, `setwise.packed_texts`; nothing staged), exactly as
    `_write_revisions_with_their_ids` writes them. False, writing nothing, when one of the SKUs is
    a product already: the chunk is then staged and merged."""
    sql, params = _all_new_sql()
    with with_packed_arrays(psycopg.Cursor(connection.connection)) as cursor:
        cursor.execute(sql, [*_columns(chunk), *params, timezone.now()])
        # One revision a row, or none at all.
        return cursor.rowcount > 0


class _Chunk(list):
    """The rows of a chunk, in file order; and once `prepare`d, its staged rows (`_Staged`) apart,
    with the six columns `_created_if_all_new` sends of them: worked out by the reading thread
    while the database writes the chunk before, not by the writer meanwhile."""

    staged: "_StagedRows | None" = None

    def prepare(self) -> "_Chunk":
        if self.staged is None:
            self.staged = _StagedRows(row for row in self if type(row) is _Staged)
            self.staged.columns = _columns(self.staged)
        return self


class _StagedRows(list):
    columns: list[PackedArray] | None = None


def _columns(rows: list[_Staged]) -> list[PackedArray]:
    """sku, title, fields, content_hash, status, line_digest of each row: `_all_new_sql`'s arrays,
    packed."""
    if isinstance(rows, _StagedRows) and rows.columns is not None:
        return rows.columns
    return [
        packed_texts([row.record.sku for row in rows]),
        packed_texts([row.record.title for row in rows]),
        packed_texts([row.fields for row in rows]),
        packed_texts([row.content_hash for row in rows]),
        packed_texts([row.record.status for row in rows]),
        packed_bytes([row.line_digest for row in rows]),
    ]


def _all_new_sql() -> tuple[str, list]:
    """`_created_if_all_new`'s statement: the rows (`s`), unnested from six arrays, then
    `_created_sql`'s, writing nothing if one of the SKUs is a product already (looked for once,
    before any row is written). Its parameters: the six arrays, the returned list, the revisions'
    time."""
    known = f"EXISTS (SELECT 1 FROM {_PRODUCTS} p WHERE p.sku = ANY (ARRAY(SELECT sku FROM rows)))"
    (products, params), revisions = _created_sql(
        f"rows s WHERE NOT {known} ORDER BY s.sku", rows="rows", fields="s.fields::jsonb"
    )
    return (
        "WITH rows AS MATERIALIZED (SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], "
        f"%b::text[], %b::bytea[]) AS s(sku, title, fields, content_hash, status, line_digest)), {products} "
        f"{revisions}".replace("%s", "%b"),
        params,
    )


def _created_sql(
    new_rows: str, *, rows: str = _STAGING, fields: str = "s.fields"
) -> tuple[tuple[str, list], str]:
    """New products and their first revisions, in one statement: `created AS (…)`, writing the
    products of `new_rows` (rows `s` in SKU order, as from `rows`) each pointed at the id its first
    revision is then written with, and its params; then the INSERT of those revisions (one param,
    their time)."""
    products, params = insert_select_sql(
        Product,
        select={
            "sku": "s.sku",
            "status": f"COALESCE(s.status, '{ProductStatus.ACTIVE}')",
            "current_revision": next_id_sql(SourceRevision),
            "line_digest": "s.line_digest",
        },
        from_sql=new_rows,
        returning=("sku", "id", "current_revision_id"),
    )
    revisions = (
        f"INSERT INTO {_REVISIONS} (id, product_id, number, title, fields, content_hash, created_at) "
        f"SELECT c.current_revision_id, c.id, 1, s.title, {fields}, s.content_hash, %s "
        f"FROM created c JOIN {rows} s ON s.sku = c.sku ORDER BY s.sku"
    )
    return (f"created AS ({products})", params), revisions


# --- uploads, imported by a worker ---------------------------------------------------------

# An upload is kept in rows of this size; a worker reads one at a time.
UPLOAD_CHUNK_BYTES = 1024 * 1024
# A worker's claim silent this long is taken to be dead, and another worker may take it over.
IMPORT_STALE_AFTER = timedelta(minutes=10)
# How long a worker may spend on one import before django-q stops it (the cluster's default is
# for short tasks).
IMPORT_TIMEOUT_SECONDS = 6 * 3600
# Progress is written at most this often.
_PROGRESS_EVERY = timedelta(seconds=1)


def store_upload(upload: UploadedFile, *, uploaded_by, skip_invalid: bool) -> CatalogueImport:
    """Keep an uploaded file in the database, where a worker on any machine can read it, and queue
    its import."""
    with transaction.atomic():
        stored = CatalogueImport.objects.create(
            file_name=(upload.name or "")[:255],
            size=upload.size,
            skip_invalid=skip_invalid,
            uploaded_by=uploaded_by,
            progress_at=timezone.now(),
        )
        for number, data in enumerate(upload.chunks(UPLOAD_CHUNK_BYTES)):
            CatalogueImportChunk.objects.create(catalogue_import=stored, number=number, data=data)
        # Once committed. A broker that cannot take the task (Redis down) leaves the import
        # queued, for the collector's pass to queue again (`queue_lost_imports`).
        transaction.on_commit(partial(_queue_task, stored.pk), robust=True)
    return stored


def _queue_task(import_id: int) -> None:
    async_task("ledger.tasks.import_catalogue_file", import_id, timeout=IMPORT_TIMEOUT_SECONDS)


def queue_lost_imports() -> int:
    """Queue again the imports whose task is lost: queued, and not started within a lease of being
    queued (the broker was down, or lost it); or running, and their worker silent for
    IMPORT_STALE_AFTER (it died). Each is marked queued now by a compare-and-set first, so one pass
    queues it once. Running it again is safe: it is claimed before it acts, one transaction,
    and a product whose content is unchanged gets no new revision. Returns how many it queued."""
    now = timezone.now()
    patience = timedelta(seconds=settings.BATCHDESK_LEASE_SECONDS)
    not_started = Q(progress_at__isnull=True) | Q(progress_at__lt=now - patience)
    lost = Q(state=ImportState.QUEUED) & not_started | Q(
        state=ImportState.RUNNING, progress_at__lt=now - IMPORT_STALE_AFTER
    )
    queued = 0
    found = CatalogueImport.objects.filter(lost).values_list("pk", "state", "progress_at")
    for import_id, state, progress_at in found:
        found_as = CatalogueImport.objects.filter(pk=import_id, state=state, progress_at=progress_at)
        if not found_as.update(state=ImportState.QUEUED, claimed_by="", progress_at=now):
            continue  # another pass, or its task, got there first
        try:
            _queue_task(import_id)
        except Exception:
            log.exception(
                "catalogue import %s could not be queued; the next pass after a lease tries again", import_id
            )
            continue
        queued += 1
    return queued


def run_stored_import(import_id: int) -> str:
    """Import an uploaded file. Safe to run twice: only the worker whose compare-and-set moved the
    import to `running` acts, and it commits only while its claim stands. Returns what happened."""
    claim, now = secrets.token_hex(8), timezone.now()
    claimable = Q(state=ImportState.QUEUED) | Q(
        state=ImportState.RUNNING, progress_at__lt=now - IMPORT_STALE_AFTER
    )
    claimed = CatalogueImport.objects.filter(claimable, pk=import_id).update(
        state=ImportState.RUNNING, claimed_by=claim, started_at=now, progress_at=now
    )
    if not claimed:
        return "not claimed"
    mine = CatalogueImport.objects.filter(pk=import_id, claimed_by=claim)
    stored = mine.get()
    last_progress = now

    def on_progress(report: ImportReport) -> None:
        nonlocal last_progress
        if stop_asked():
            raise _Stopping
        if timezone.now() - last_progress >= _PROGRESS_EVERY:
            last_progress = timezone.now()
            _save_progress(mine, report)

    def finish(report: ImportReport) -> None:
        if not mine.update(state=ImportState.DONE, finished_at=timezone.now(), **_report_values(report)):
            raise _ClaimLost
        CatalogueImportChunk.objects.filter(catalogue_import_id=import_id).delete()

    try:
        report = import_catalogue(
            StoredFile(stored),
            skip_invalid=stored.skip_invalid,
            on_progress=on_progress,
            before_commit=finish,
        )
        if not report.imported:  # refused: nothing was written, and `finish` was not called
            with transaction.atomic():
                finish(report)
    except _ClaimLost:
        return "taken over"
    except _Stopping:
        # Rolled back: queued again, for a worker that is not stopping.
        if mine.update(state=ImportState.QUEUED, claimed_by="", progress_at=timezone.now()):
            _queue_task(import_id)
        return ImportState.QUEUED
    except Exception:
        log.exception("catalogue import %s failed", import_id)
        failure = "The import stopped on an unexpected error; nothing was imported. The error is in the worker's log."
        if mine.update(state=ImportState.FAILED, failure=failure, finished_at=timezone.now()):
            CatalogueImportChunk.objects.filter(catalogue_import_id=import_id).delete()
        return ImportState.FAILED
    return ImportState.DONE


class _ClaimLost(Exception):
    """Another worker took the import over: this one's writes are rolled back."""


class _Stopping(Exception):
    """The worker's cluster is stopping: the import is rolled back and queued again."""


def _report_values(report: ImportReport) -> dict:
    counts = ("created", "revised", "unchanged", "withdrawn", "reactivated", "rejected")
    return {
        "counts": {name: getattr(report, name) for name in counts},
        "errors": [[error.line, error.message, isinstance(error, Unreadable)] for error in report.errors],
        "error_count": report.error_count,
        "imported": report.imported,
        "rows_read": report.rows_read,
        "checked_bytes": report.checked_bytes,
        "rows_written": report.rows_written,
    }


def report_of(stored: CatalogueImport) -> ImportReport:
    """The report of a finished import, as `import_catalogue` returned it."""
    errors = [
        (Unreadable if unreadable else Rejection)(line, message)
        for line, message, unreadable in stored.errors
    ]
    return ImportReport(
        **stored.counts,
        errors=errors,
        error_count=stored.error_count,
        imported=stored.imported,
        rows_read=stored.rows_read,
        checked_bytes=stored.checked_bytes,
        rows_written=stored.rows_written,
    )


def _save_progress(mine, report: ImportReport) -> None:
    values = {
        "rows_read": report.rows_read,
        "checked_bytes": report.checked_bytes,
        "rows_written": report.rows_written,
        "progress_at": timezone.now(),
    }
    if not connection.in_atomic_block:
        mine.update(**values)
    elif connection.vendor == "postgresql":
        # The writing pass is one transaction nobody sees until it commits: its progress goes
        # through a connection of its own (a thread has one). SQLite allows one writer at a time,
        # so there the page shows the writing pass without its count.
        def save() -> None:
            try:
                mine.update(**values)
            finally:
                connections.close_all()

        thread = threading.Thread(target=save)
        thread.start()
        thread.join()


class StoredFile:
    """An upload read back from its chunks, one chunk in memory at a time: lines, and a rewind."""

    def __init__(self, stored: CatalogueImport) -> None:
        self.name = stored.file_name
        self._import_id = stored.pk
        self.seek(0)

    def seek(self, offset: int, whence: int = 0, /) -> int:
        if (offset, whence) != (0, 0):
            raise ValueError("a stored upload can only be rewound")
        self._next, self._chunk, self._offset = 0, b"", 0
        return 0

    def readline(self, size: int = -1, /) -> bytes:
        wanted = size if size >= 0 else math.inf
        parts = []
        while wanted > 0:
            if self._offset == len(self._chunk) and not self._load_next_chunk():
                break
            limit = (
                len(self._chunk) if wanted == math.inf else min(len(self._chunk), self._offset + int(wanted))
            )
            end = self._chunk.find(b"\n", self._offset, limit)
            stop = end + 1 if end >= 0 else limit
            parts.append(self._chunk[self._offset : stop])
            wanted -= stop - self._offset
            self._offset = stop
            if end >= 0:
                break
        return b"".join(parts)

    def _load_next_chunk(self) -> bool:
        chunks = CatalogueImportChunk.objects.filter(catalogue_import_id=self._import_id, number=self._next)
        data = chunks.values_list("data", flat=True).first()
        if data is None:
            return False
        self._next, self._chunk, self._offset = self._next + 1, bytes(data), 0
        return True


# --- reading -------------------------------------------------------------------------------


def _read(
    stream: BinaryLines, *, name: str, known: "_KnownLines | None" = None, keep_fields: bool = True
) -> Iterator["_Staged | _Recognised | Rejection"]:
    """The file's rows, staged. Without `keep_fields` each record's fields are None: the rows are
    written from their JSON (`_Staged.fields`), and the dicts and lists read, the bulk of a row's
    memory, are let go at once rather than held while a chunk waits."""
    seen = _SeenSkus()
    extension = os.path.splitext(name)[1].lower()
    is_jsonl = {".jsonl": True, ".json": True, ".csv": False}.get(extension)

    def recognised(number: int, digest: bytes) -> "_Recognised | None":
        # Only JSONL lines (a file of unknown kind is recognised once its first line says it is).
        # A repeated SKU is read in full, which words its refusal.
        if is_jsonl and (found := known.find(digest)) and seen.first_line_of(found[1], number) is None:
            return _Recognised(number, found[0], digest + found[1].to_bytes(8))
        return None

    lines = _physical_lines(stream, recognised=recognised if known else None)
    if is_jsonl is None:
        leading: list[_Line] = []
        for line in lines:
            leading.append(line)
            if line.problem or line.text.strip():
                break
        is_jsonl = bool(leading) and leading[-1].text.lstrip().startswith("{")
        lines = chain(leading, lines)
    if not is_jsonl:
        for row in _read_csv(lines):
            yield _staged(row if isinstance(row, Rejection) else _check(*row, seen), keep_fields)
        return
    for line in lines:
        if type(line) is _Recognised:
            yield line
            continue
        if line.problem is None and (usual := _usual_row(line, seen, keep_fields)) is not None:
            yield usual
            continue
        for row in _read_jsonl((line,)):
            staged = _staged(row if isinstance(row, Rejection) else _check(*row, seen), keep_fields)
            if isinstance(staged, _Staged) and line.digest:
                staged = staged._replace(
                    line_digest=product_line_digest(line.digest, sku_digest(staged.record.sku.encode()))
                )
            yield staged


# models.canonical_json's rendering, refusing what is not JSON (NaN, infinity).
_CANONICAL = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _refuse_to_encode(value: object) -> NoReturn:
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def _canonical_encoder() -> Callable[[object], str]:
    """`_CANONICAL.encode`, without making its C encoder again for every row (a third of its time):
    the same C encoder, made once, with the same settings. No check for cycles: a value just read
    from JSON has none. Python's own encode where there is no C encoder."""
    if c_make_encoder is None:
        return _CANONICAL.encode
    encode = c_make_encoder(
        None,  # markers: no check for cycles
        _refuse_to_encode,
        encode_basestring,  # ensure_ascii=False
        None,  # indent
        _CANONICAL.key_separator,
        _CANONICAL.item_separator,
        _CANONICAL.sort_keys,
        _CANONICAL.skipkeys,
        _CANONICAL.allow_nan,
    )
    return lambda value: "".join(encode(value, 0))


_canonical = _canonical_encoder()


def _float_as_json(value: object) -> orjson.Fragment:
    """orjson's hook for what it cannot write: a float jiter read as written (its LosslessFloat), as
    the json module writes it (Python's shortest repr); a float beyond the finite is refused."""
    if type(value) is not jiter.LosslessFloat:
        raise TypeError(f"{type(value).__name__} is not a JSON value")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError("not a finite number")
    return orjson.Fragment(float.__repr__(number))


# The keys of a JSONL record that are not product fields.
_NOT_FIELDS = frozenset(("sku", "title", "status"))
_STATUSES = frozenset(ProductStatus.values)


def _usual_row(
    line: _Line, seen: "_SeenSkus", keep_fields: bool = True, *, floats_read: bool = False
) -> _Staged | Rejection | None:
    """A usual JSONL row read and checked in a few C calls: staged exactly as `_read_jsonl` and
    `_check` would stage it (same record, fields and hash), or its one problem, a SKU seen before.
    None for anything unusual, which the full reading then reads and words.

    Its fields are rendered by orjson, which writes any JSON value as the json module does but a
    float (1e16, not 1e+16). So a float is read as jiter's LosslessFloat, which orjson hands to
    `_float_as_json`. A row orjson cannot write (an integer beyond 64 bits, nesting deeper than
    orjson goes, or, where the fields are kept and must hold Python floats, a float) is read again
    with `floats_read`, as Python floats, and rendered by the json module.

    Python's json keeps the last of two equal keys without a word, so they are found by counting:
    every `:` of the line is a key's or inside a text, and the record rebuilt from what was read
    holds as many unless a key was dropped. An escaped colon (\\u003a) would upset the count, so
    such a line, like NaN and Infinity, goes the full way."""
    text = line.text
    if "\\u003" in text or "NaN" in text or "Infinity" in text:
        return None
    try:
        # jiter reads what Python's json reads, alike, about twice as fast; what it refuses (a lone
        # surrogate escape, say) goes the full way, which words it.
        data = jiter.from_json(
            text.encode(), cache_mode="keys", float_mode="float" if floats_read else "lossless-float"
        )
    except (ValueError, RecursionError, UnicodeEncodeError):
        return None
    if type(data) is not dict:
        return None
    sku, title, status = data.get("sku"), data.get("title"), data.get("status")
    if type(sku) is not str or not SKU_PATTERN.fullmatch(sku) or type(title) is not str:
        return None
    title = title.strip()
    if not title or len(title) > MAX_TITLE_LENGTH or "\x00" in title:
        return None
    if status is not None:
        if type(status) is not str:
            return None
        status = status.strip().lower() or None
        if status is not None and status not in _STATUSES:
            return None
    # Every other key is a field. The checks are whole-list operations (done in C): a padded or
    # blank key or text is left to the full reading; null and "" are left out, as it leaves them.
    fields = {key: value for key, value in data.items() if key not in _NOT_FIELDS}
    keys = list(fields)
    texts = [value for value in fields.values() if type(value) is str]
    if "" in keys or list(map(str.strip, keys)) != keys:
        return None
    # Colons of the line that the fields' canonical rendering below will not hold.
    colons = sum(1 + value.count(":") if type(value) is str else 1 for value in (sku, title, status)) - sum(
        key not in data for key in _NOT_FIELDS
    )
    if None in fields.values() or "" in texts:
        for key in [key for key, value in fields.items() if value is None or value == ""]:
            colons += 1 + key.count(":")
            del fields[key]
        texts = [value for value in texts if value]
    if list(map(str.strip, texts)) != texts:
        return None
    try:
        if floats_read:
            rendered = _canonical(fields)
        else:
            # Rows whose fields are not kept have their floats written as the json module writes
            # them, by orjson's hook; kept fields must hold Python floats, so they are read again.
            hook = None if keep_fields else _float_as_json
            rendered = orjson.dumps(fields, default=hook, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # orjson.JSONEncodeError is one
        return None if floats_read else _usual_row(line, seen, keep_fields, floats_read=True)
    except (ValueError, RecursionError):
        return None
    if (
        text.count(":") != rendered.count(":") + colons
        or rendered.count("[") + rendered.count("{") > MAX_FIELD_DEPTH
        or "\\u0000" in rendered
    ):
        return None
    # canonical_json({"title": …, "fields": …}) without rendering the fields twice.
    content = f'{{"fields":{rendered},"title":{encode_basestring(title)}}}'
    try:
        digest = hashlib.sha256(content.encode("utf-8")).hexdigest()
    except UnicodeEncodeError:  # an unpaired surrogate
        return None
    sku_number = sku_digest(sku.encode())  # once, for both
    if (first := seen.first_line_of(sku_number, line.number)) is not None:
        return Rejection(line.number, f'sku "{sku}" appears again (first on line {first})')
    stored = product_line_digest(line.digest, sku_number) if line.digest else None
    return _Staged(
        Record(line.number, sku, title, status, fields if keep_fields else None), rendered, digest, stored
    )


def _physical_lines(
    stream: BinaryLines, *, recognised: "Callable[[int, bytes], _Recognised | None] | None" = None
) -> "Iterator[_Line | _Recognised]":
    """The file's lines, numbered. With `recognised`, each line's digest is taken from its bytes
    and a line it recognises is handed on as it says, without being decoded."""
    number = 0
    while raw := stream.readline(_READ_LIMIT):
        number += 1
        if not raw.endswith(b"\n") and len(raw) == _READ_LIMIT:
            # Never hold an arbitrarily long line in memory: measure the rest and drop it.
            size = len(raw)
            while rest := stream.readline(_READ_LIMIT):
                size += len(rest)
                if rest.endswith(b"\n"):
                    break
            yield _Line(number, "\n", size, _too_large(size))
            continue
        content = raw.rstrip(b"\r\n")
        if number == 1:
            content = content.removeprefix(_BOM)
        if len(content) > MAX_RECORD_BYTES:
            yield _Line(number, "\n", len(content), _too_large(len(content)))
            continue
        digest = None
        if recognised is not None and content:
            digest = line_digest(content)
            if known := recognised(number, digest):
                yield known
                continue
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError as error:
            problem = (
                f"not valid UTF-8 (byte 0x{content[error.start]:02x} at position {error.start + 1}); "
                "save the file as UTF-8"
            )
            yield _Line(number, "\n", len(content), problem)
            continue
        yield _Line(number, text + "\n", len(content), None, digest)


def _too_large(size: int) -> str:
    return f"the record is {size:,} bytes; at most {MAX_RECORD_BYTES:,} (64 KB) are allowed"


def _read_jsonl(lines: Iterable[_Line]) -> Iterator[tuple[int, dict] | Rejection]:
    for line in lines:
        if line.problem:
            yield Rejection(line.number, line.problem)
            continue
        if not line.text.strip():
            continue
        try:
            data = json.loads(
                line.text, object_pairs_hook=unique_json_keys, parse_constant=refuse_json_constant
            )
        except InvalidJson as error:
            yield Rejection(line.number, str(error))
            continue
        except json.JSONDecodeError as error:
            yield Rejection(line.number, f"not valid JSON ({error.msg} at column {error.colno})")
            continue
        except RecursionError:
            yield Rejection(line.number, "not valid JSON here (lists or objects nested thousands deep)")
            continue
        except ValueError as error:  # an integer of more than 4300 digits, say
            yield Rejection(line.number, f"not valid JSON here ({error})")
            continue
        if not isinstance(data, dict):
            kind = "a list" if isinstance(data, list) else "a single value"
            yield Rejection(
                line.number, f'expected a JSON object like {{"sku": …, "title": …}}, found {kind}'
            )
            continue
        yield line.number, data


def _read_csv(lines: Iterable[_Line]) -> Iterator[tuple[int, dict] | Rejection]:
    consumed: list[_Line] = []

    def texts() -> Iterator[str]:
        for line in lines:
            consumed.append(line)
            yield line.text

    # The reader pulls only the lines of one row at a time, so `consumed` is that row's lines.
    reader = csv.reader(texts(), strict=True)
    header: list[str] | None = None
    while True:
        consumed.clear()
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            row = None
            problem = _span_problem(consumed) or (
                f"not valid CSV ({error}); put a cell holding commas, quotes or line breaks "
                'in double quotes, and double any quote inside it ("")'
            )
        else:
            problem = _span_problem(consumed)
        first = consumed[0].number
        if header is None:
            if problem:
                yield Unreadable(first, problem)
                return
            if row is not None and any(cell.strip() for cell in row):
                try:
                    header = _header(row)
                except InvalidJson as error:
                    yield Unreadable(first, str(error))
                    return
            continue
        if problem:
            yield Rejection(first, problem)
        elif row is None or not any(cell.strip() for cell in row):
            continue
        elif len(row) > len(header):
            yield Rejection(first, f"{len(row)} cells, but the header names {len(header)} columns")
        else:
            yield first, dict(zip(header, row, strict=False))


def _span_problem(lines: list[_Line]) -> str | None:
    """The first problem of a record that may span several physical lines."""
    for line in lines:
        if line.problem:
            where = f" (on line {line.number})" if line is not lines[0] else ""
            return line.problem + where
    size = sum(line.size for line in lines) + len(lines) - 1
    return _too_large(size) if size > MAX_RECORD_BYTES else None


def _header(row: list[str]) -> list[str]:
    names = [cell.strip() for cell in row]
    for position, name in enumerate(names, start=1):
        if not name:
            raise InvalidJson(f"column {position} of the header has no name")
        if names.index(name) != position - 1:
            raise InvalidJson(f'the header names the column "{name}" twice')
    missing = [required for required in ("sku", "title") if required not in names]
    if missing:
        hint = "; cells must be separated by commas" if any(";" in name for name in names) else ""
        raise InvalidJson(
            f"the header must name the columns sku and title (missing: {', '.join(missing)}){hint}"
        )
    return names


# --- checking one record -------------------------------------------------------------------


def _check(line: int, data: dict[str, object], seen: "_SeenSkus") -> Record | Rejection:
    problems: list[str] = []
    values = normalise_keys(data, problems)
    sku = check_sku(values.pop("sku", None), problems)
    if sku is not None and (first := seen.first_line(sku, line)) is not None:
        problems.append(f'sku "{sku}" appears again (first on line {first})')
    title = check_title(values.pop("title", None), problems)
    status = _status(values.pop("status", None), problems)
    fields = check_fields(values, problems)
    if problems or sku is None or title is None:
        return Rejection(line, "; ".join(problems))
    return Record(line, sku, title, status, fields)


class _SeenSkus:
    """The line each SKU of a file was first seen on, whatever the number of SKUs: an open-addressing
    table of 64-bit digests of the SKUs (`sku_digest`) beside their 32-bit line numbers, in two
    arrays of 12 bytes a slot, kept between three eighths and three quarters full: 16 to 32 bytes a
    SKU (25 MB at 1.2 million, 38 MB for a moment while it doubles). Two different SKUs sharing a
    digest would be reported as a repeat; in a file of a million SKUs the odds are about 1 in 37 million."""

    def __init__(self) -> None:
        self._digests = array("Q", bytes(8 * 1024))  # 0: an empty slot
        self._lines = array("I", bytes(4 * 1024))
        self._count = 0

    def first_line(self, sku: str, line: int) -> int | None:
        """The line `sku` was first seen on; None (and `line` is remembered) the first time."""
        return self.first_line_of(sku_digest(sku.encode()), line)

    def first_line_of(self, digest: int, line: int) -> int | None:
        """`first_line` of the SKU whose `sku_digest` this is."""
        slot = self._slot(digest)
        if self._digests[slot]:
            return self._lines[slot]
        self._digests[slot], self._lines[slot] = digest, line
        self._count += 1
        if 4 * self._count > 3 * len(self._digests):
            self._double()
        return None

    def _slot(self, digest: int) -> int:
        mask = len(self._digests) - 1
        slot = digest & mask
        while self._digests[slot] not in (0, digest):
            slot = (slot + 1) & mask
        return slot

    def _double(self) -> None:
        digests, lines = self._digests, self._lines
        self._digests = array("Q", bytes(16 * len(digests)))
        self._lines = array("I", bytes(8 * len(lines)))
        for digest, line in zip(digests, lines, strict=True):
            if digest:
                slot = self._slot(digest)
                self._digests[slot], self._lines[slot] = digest, line


def sku_digest(sku: bytes) -> int:
    """64 bits of a SKU's BLAKE2b, never 0 (0 marks an empty slot of `_SeenSkus`)."""
    return int.from_bytes(hashlib.blake2b(sku, digest_size=8).digest()) or 1


# A new version here makes every line unknown again (when what a line means changes).
_LINE_DIGEST_PERSON = b"bd-line-1"


def line_digest(content: bytes) -> bytes:
    """A catalogue line's digest, taken over its bytes (without the line end)."""
    return hashlib.blake2b(content, digest_size=16, person=_LINE_DIGEST_PERSON).digest()


def product_line_digest(line: bytes, sku_number: int) -> bytes:
    """What a product keeps (`Product.line_digest`): its line's digest, then its SKU's (`sku_digest`)."""
    return line + sku_number.to_bytes(8)


class _LineNotRecognised(Exception):
    """A recognised line's product changed meanwhile: the import starts again, reading every line."""


def _may_recognise(name: str) -> bool:
    """Lines are recognised in JSONL files on PostgreSQL (a CSV row's meaning is its header's too)."""
    return connection.vendor == "postgresql" and os.path.splitext(name)[1].lower() != ".csv"


class _KnownLines:
    """The lines that made products what they are now (`Product.line_digest`), read once at the
    start of an import: a line met again is unchanged, and is neither decoded, parsed nor hashed
    as content. Three arrays of 64-bit numbers sorted by the line's digest: its first 8 bytes,
    the product's SKU digest (for `_SeenSkus`) and the product's id: 24 bytes a product (29 MB at
    1.2 million), read a batch at a time. Each recognised line is confirmed by the database
    (`_confirm`) with its whole digest before it counts."""

    _BATCH = 50_000

    def __init__(self) -> None:
        self.prefixes, self.skus, self.ids = array("Q"), array("Q"), array("Q")

    def _add(self, records: bytes) -> None:
        numbers = memoryview(records).cast("Q")
        for column, start in ((self.prefixes, 0), (self.skus, 1), (self.ids, 2)):
            values = array("Q", numbers[start::3])
            if sys.byteorder == "little":  # PostgreSQL sends them big-endian
                values.byteswap()
            column.extend(values)

    @classmethod
    def load(cls) -> "_KnownLines":
        known = cls()
        # A cursor of the driver's own, in the import's transaction, for the bytes as they are sent;
        # on the server (named), so a batch at a time is held.
        with psycopg.ServerCursor(connection.connection, "bd_known_lines") as cursor:
            cursor.execute(
                "SELECT substring(line_digest FROM 1 FOR 8) || substring(line_digest FROM 17 FOR 8) "
                f"|| int8send(id) FROM {_PRODUCTS} WHERE octet_length(line_digest) = 24 ORDER BY line_digest",
                binary=True,
            )
            while rows := cursor.fetchmany(cls._BATCH):
                known._add(b"".join(record for (record,) in rows))
        return known

    def find(self, digest: bytes) -> tuple[int, int] | None:
        """(product id, SKU digest) of the product whose line has this digest, if any."""
        prefix = int.from_bytes(digest[:8])
        position = bisect_left(self.prefixes, prefix)
        if position < len(self.prefixes) and self.prefixes[position] == prefix:
            return self.ids[position], self.skus[position]
        return None


def normalise_keys(data: dict[str, object], problems: list[str]) -> dict[str, object]:
    values: dict[str, object] = {}
    for key, value in data.items():
        name = key.strip()
        if not name:
            problems.append("a field has no name")
        elif name in values:
            problems.append(f'the field "{name}" appears twice')
        elif (problem := text_problem(name)) is not None:
            problems.append(f"a field name {problem}")
        else:
            values[name] = value
    return values


def check_sku(value: object, problems: list[str]) -> str | None:
    if value is not None and not isinstance(value, str):
        problems.append("sku must be text")
        return None
    sku = (value or "").strip()
    if not sku:
        problems.append("sku is missing")
        return None
    if not SKU_PATTERN.fullmatch(sku):
        problems.append(f"sku {shown(sku)} is not valid ({SKU_RULE})")
        return None
    return sku


def check_title(value: object, problems: list[str]) -> str | None:
    if value is None:
        problems.append("title is missing")
        return None
    if not isinstance(value, str):
        problems.append("title must be text")
        return None
    title = value.strip()
    if not title:
        problems.append("title is empty")
        return None
    if len(title) > MAX_TITLE_LENGTH:
        problems.append(f"title is {len(title)} characters long; at most {MAX_TITLE_LENGTH}")
        return None
    if (problem := text_problem(title)) is not None:
        problems.append(f"title {problem}")
        return None
    return title


def _status(value: object, problems: list[str]) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        problems.append("status must be text: active or withdrawn")
        return None
    status = value.strip().lower()
    if not status:
        return None
    if status not in ProductStatus.values:
        problems.append(f"status {shown(value.strip())} is not valid (active or withdrawn)")
        return None
    return status


def check_fields(values: dict[str, object], problems: list[str]) -> dict[str, FieldValue]:
    """Every other key is a product field, as read from JSON or CSV. Blank values (empty cells, "",
    null) are left out and text is stripped; inside a list or an object every value is kept as given."""
    fields: dict[str, FieldValue] = {}
    # One quick look at the whole record usually clears every field (stripping changes nothing it sees).
    plain = _plainly_storable(values)
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, str):
            value = value.strip()
            if not value:
                continue
        if not plain and (problem := json_value_problem(value, f'field "{name}"')):
            problems.append(problem)
        else:
            fields[name] = value
    return fields


def _plainly_storable(values: dict[str, object]) -> bool:
    """A quick yes, in C rather than a walk in Python, for most records read from JSON or CSV (which
    hold JSON types only); no means `json_value_problem` looks at each field closely."""
    try:
        text = json.dumps(values, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return False
    # So few brackets cannot nest too deep. NUL is written as an escape; an unpaired surrogate is
    # left as it is, and cannot be encoded.
    return (
        text.count("[") + text.count("{") <= MAX_FIELD_DEPTH
        and "\\u0000" not in text
        and text_problem(text) is None
    )
