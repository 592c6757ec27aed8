"""Reading a catalogue file: JSONL or CSV, in binary, decoded line by line, so a record that is not
UTF-8, too large or malformed is reported with the physical line it starts on. A usual JSONL row is
read in a few C calls (`usual_rows`); anything unusual is read and worded here in full. A report
keeps the first 100 problems and counts the others.
"""

import csv
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from itertools import chain

from ..drafts.json_values import (
    InvalidJson,
    refuse_json_constant,
    unique_json_keys,
)
from ..models import (
    CatalogueImport,
    CatalogueImportChunk,
)
from .checks import check_record
from .digests import KnownLines, SeenSkus, line_digest, product_line_digest, sku_digest
from .records import (
    MAX_RECORD_BYTES,
    BinaryLines,
    CatalogueSource,
    Line,
    Recognised,
    Record,
    Rejection,
    Staged,
    Unreadable,
    _staged,
)
from .usual_rows import usual_row

# Enough to tell a line that is exactly at the limit (plus CR LF) from one that is over it.
_READ_LIMIT = MAX_RECORD_BYTES + 3


_BOM = b"\xef\xbb\xbf"


# A file on disk is read this much at a time.
_FILE_BUFFER_BYTES = 1024 * 1024


def read_catalogue(source: CatalogueSource) -> Iterator[Record | Rejection]:
    """Read and check a catalogue file, row by row in file order; nothing is written.

    The format comes from the name (`.jsonl`/`.json`, `.csv`); otherwise a first non-blank
    character `{` means JSONL. An `Unreadable` ends the rows.
    """
    with opened(source) as (stream, name):
        for row in stage_rows(stream, name=name):
            yield row if isinstance(row, Rejection) else row.record


@contextmanager
def opened(source: CatalogueSource) -> Iterator[tuple[BinaryLines, str]]:
    if isinstance(source, str | os.PathLike):
        # Read a megabyte at a time: each read is a system call that hands the interpreter to the
        # writing thread and back. An unchanged re-import of 100,000 products took 1.0 s reading
        # 8 KB at a time (the default) and 0.7 s reading a megabyte.
        with open(source, "rb", buffering=_FILE_BUFFER_BYTES) as stream:
            yield stream, os.fspath(source)
    else:
        source.seek(0)
        yield source, str(getattr(source, "name", "") or "")


class CountingReader:
    def __init__(self, stream: BinaryLines) -> None:
        self.stream = stream
        self.bytes_read = 0

    def readline(self, size: int = -1, /) -> bytes:
        line = self.stream.readline(size)
        self.bytes_read += len(line)
        return line


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


def stage_rows(
    stream: BinaryLines, *, name: str, known: "KnownLines | None" = None, keep_fields: bool = True
) -> Iterator["Staged | Recognised | Rejection"]:
    """The file's rows, staged. Without `keep_fields` each record's fields are None: the rows are
    written from their JSON (`Staged.fields`), and the dicts and lists read, the bulk of a row's
    memory, are let go at once rather than held while a chunk waits."""
    seen = SeenSkus()
    extension = os.path.splitext(name)[1].lower()
    is_jsonl = {".jsonl": True, ".json": True, ".csv": False}.get(extension)

    def recognised(number: int, digest: bytes) -> "Recognised | None":
        # Only JSONL lines (a file of unknown kind is recognised once its first line says it is).
        # A repeated SKU is read in full, which words its refusal.
        if is_jsonl and (found := known.find(digest)) and seen.first_line_of(found[1], number) is None:
            return Recognised(number, found[0], digest + found[1].to_bytes(8))
        return None

    lines = _physical_lines(stream, recognised=recognised if known else None)
    if is_jsonl is None:
        leading: list[Line] = []
        for line in lines:
            leading.append(line)
            if line.problem or line.text.strip():
                break
        is_jsonl = bool(leading) and leading[-1].text.lstrip().startswith("{")
        lines = chain(leading, lines)
    if not is_jsonl:
        for row in _read_csv(lines):
            yield _staged(row if isinstance(row, Rejection) else check_record(*row, seen), keep_fields)
        return
    for line in lines:
        if type(line) is Recognised:
            yield line
            continue
        if line.problem is None and (usual := usual_row(line, seen, keep_fields)) is not None:
            yield usual
            continue
        for row in _read_jsonl((line,)):
            staged = _staged(row if isinstance(row, Rejection) else check_record(*row, seen), keep_fields)
            if isinstance(staged, Staged) and line.digest:
                staged = staged._replace(
                    line_digest=product_line_digest(line.digest, sku_digest(staged.record.sku.encode()))
                )
            yield staged


def _physical_lines(
    stream: BinaryLines, *, recognised: "Callable[[int, bytes], Recognised | None] | None" = None
) -> "Iterator[Line | Recognised]":
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
            yield Line(number, "\n", size, _too_large(size))
            continue
        content = raw.rstrip(b"\r\n")
        if number == 1:
            content = content.removeprefix(_BOM)
        if len(content) > MAX_RECORD_BYTES:
            yield Line(number, "\n", len(content), _too_large(len(content)))
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
            yield Line(number, "\n", len(content), problem)
            continue
        yield Line(number, text + "\n", len(content), None, digest)


def _too_large(size: int) -> str:
    return f"the record is {size:,} bytes; at most {MAX_RECORD_BYTES:,} (64 KB) are allowed"


def _read_jsonl(lines: Iterable[Line]) -> Iterator[tuple[int, dict] | Rejection]:
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


def _read_csv(lines: Iterable[Line]) -> Iterator[tuple[int, dict] | Rejection]:
    consumed: list[Line] = []

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
            # A row shorter than the header leaves its last columns blank: they are named all the same.
            yield first, dict(zip(header, row + [None] * (len(header) - len(row)), strict=True))


def _span_problem(lines: list[Line]) -> str | None:
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
