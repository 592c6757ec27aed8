"""Catalogue files (SPEC §7): read JSONL or CSV into checked records, then import them.

A file is read in binary and decoded line by line, so a record that is not UTF-8, too large or
malformed is reported with the physical line it starts on. Importing is all or nothing unless
the caller asks to skip invalid rows: a rejected file leaves the ledger exactly as it was.
"""

import csv
import json
import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import NamedTuple, NoReturn, Protocol

from django.db import transaction

from .actions import record_product
from .models import Product, ProductStatus

MAX_RECORD_BYTES = 65536
MAX_TITLE_LENGTH = 300
SKU_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SKU_RULE = "letters, digits, . _ - ; at most 64"

# Enough to tell a line that is exactly at the limit (plus CR LF) from one that is over it.
_READ_LIMIT = MAX_RECORD_BYTES + 3
_BOM = b"\xef\xbb\xbf"
# Existing products are locked in batches to keep each query's list of SKUs short.
_LOCK_BATCH = 1000
# How deep lists and objects may nest in a field's value: `"features": ["LED"]` is 1 deep,
# `"sizes": [{"w_cm": 30}]` 2. Real catalogues need 2 or 3; the limit keeps every reader of a
# value (hashing, prompts, screens) far from Python's recursion limit.
MAX_FIELD_DEPTH = 8

type JsonValue = str | int | float | bool | None | list[JsonValue] | dict[str, JsonValue]
# A product field: text, a number, true/false, or a list or object of JSON values (SPEC §7).
type FieldValue = str | int | float | bool | list[JsonValue] | dict[str, JsonValue]


class BinaryLines(Protocol):
    """Anything read in binary a line at a time: an open file, BytesIO, a Django UploadedFile."""

    def readline(self, size: int = -1, /) -> bytes: ...


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


@dataclass
class ParseResult:
    records: list[Record] = field(default_factory=list)
    errors: list[Rejection] = field(default_factory=list)
    # Set when the file as a whole cannot be read (a CSV header without sku/title, say).
    file_error: Rejection | None = None


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
    errors: list[Rejection] = field(default_factory=list)
    imported: bool = False

    @property
    def summary(self) -> str:
        return (
            f"created {self.created}, revised {self.revised}, unchanged {self.unchanged}, "
            f"withdrawn {self.withdrawn}, rejected {self.rejected}"
        )


class _Invalid(ValueError):
    pass


class _Line(NamedTuple):
    number: int
    # Decoded text ending in "\n" (what the csv module reads); "\n" alone when unreadable.
    text: str
    size: int
    problem: str | None


def parse_catalogue(source: CatalogueSource) -> ParseResult:
    """Read and check a catalogue file; nothing is written.

    `source` is a path or a binary file-like object (left open). The format comes from the
    name (`.jsonl`/`.json`, `.csv`); otherwise a first non-blank character `{` means JSONL.
    """
    if isinstance(source, str | os.PathLike):
        with open(source, "rb") as stream:
            return _parse(stream, name=os.fspath(source))
    return _parse(source, name=str(getattr(source, "name", "") or ""))


def import_catalogue(source: CatalogueSource, *, skip_invalid: bool = False) -> ImportReport:
    """Create and revise products from a catalogue file, in one transaction.

    Any rejected row stops the whole import unless `skip_invalid`, in which case the valid
    rows are imported and the others counted as rejected. Products missing from the file are
    left alone; a row without a status leaves an existing product's status alone.
    """
    parsed = parse_catalogue(source)
    report = ImportReport(rejected=len(parsed.errors), errors=list(parsed.errors))
    if parsed.file_error is not None:
        report.errors.insert(0, parsed.file_error)
        return report
    if parsed.errors and not skip_invalid:
        return report
    # Rows are taken in SKU order so that two imports running at once lock products in the same
    # order and cannot deadlock.
    records = sorted(parsed.records, key=lambda record: record.sku)
    with transaction.atomic():
        before = _lock_existing([record.sku for record in records])
        for record in records:
            change = record_product(
                sku=record.sku, title=record.title, fields=record.fields, status=record.status
            )
            reactivated = before.get(record.sku) == ProductStatus.WITHDRAWN and (
                record.status == ProductStatus.ACTIVE
            )
            report.created += change.created
            report.revised += change.revised
            report.withdrawn += change.withdrawn and not change.created
            report.reactivated += reactivated
            report.unchanged += not (change.created or change.revised or change.withdrawn or reactivated)
    report.imported = True
    return report


def _lock_existing(sorted_skus: list[str]) -> dict[str, str]:
    """Lock the file's existing products and return their status before the import."""
    statuses: dict[str, str] = {}
    for start in range(0, len(sorted_skus), _LOCK_BATCH):
        batch = sorted_skus[start : start + _LOCK_BATCH]
        rows = Product.objects.select_for_update().filter(sku__in=batch).order_by("sku")
        statuses.update(rows.values_list("sku", "status"))
    return statuses


# --- reading -------------------------------------------------------------------------------


def _parse(stream: BinaryLines, *, name: str) -> ParseResult:
    lines: Iterator[_Line] = _physical_lines(stream)
    extension = os.path.splitext(name)[1].lower()
    if extension in (".jsonl", ".json"):
        is_jsonl = True
    elif extension == ".csv":
        is_jsonl = False
    else:
        leading: list[_Line] = []
        for line in lines:
            leading.append(line)
            if line.problem or line.text.strip():
                break
        is_jsonl = bool(leading) and leading[-1].text.lstrip().startswith("{")
        lines = chain(leading, lines)
    collector = _Collector()
    if is_jsonl:
        _read_jsonl(lines, collector)
    else:
        _read_csv(lines, collector)
    return collector.result


def _physical_lines(stream: BinaryLines) -> Iterator[_Line]:
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
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError as error:
            problem = (
                f"not valid UTF-8 (byte 0x{content[error.start]:02x} at position {error.start + 1}); "
                "save the file as UTF-8"
            )
            yield _Line(number, "\n", len(content), problem)
            continue
        yield _Line(number, text + "\n", len(content), None)


def _too_large(size: int) -> str:
    return f"the record is {size:,} bytes; at most {MAX_RECORD_BYTES:,} (64 KB) are allowed"


def _read_jsonl(lines: Iterable[_Line], collector: "_Collector") -> None:
    for line in lines:
        if line.problem:
            collector.reject(line.number, line.problem)
            continue
        if not line.text.strip():
            continue
        try:
            data = json.loads(
                line.text, object_pairs_hook=unique_json_keys, parse_constant=refuse_json_constant
            )
        except _Invalid as error:
            collector.reject(line.number, str(error))
            continue
        except json.JSONDecodeError as error:
            collector.reject(line.number, f"not valid JSON ({error.msg} at column {error.colno})")
            continue
        except RecursionError:
            collector.reject(line.number, "not valid JSON here (lists or objects nested thousands deep)")
            continue
        except ValueError as error:  # an integer of more than 4300 digits, say
            collector.reject(line.number, f"not valid JSON here ({error})")
            continue
        if not isinstance(data, dict):
            kind = "a list" if isinstance(data, list) else "a single value"
            collector.reject(
                line.number, f'expected a JSON object like {{"sku": …, "title": …}}, found {kind}'
            )
            continue
        collector.add(line.number, data)


def unique_json_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    data: dict[str, object] = {}
    for key, value in pairs:
        if key in data:
            raise _Invalid(f'the key "{key}" appears twice')
        data[key] = value
    return data


def refuse_json_constant(name: str) -> NoReturn:
    raise _Invalid(f"not valid JSON ({name} is not a number)")


def _read_csv(lines: Iterable[_Line], collector: "_Collector") -> None:
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
                collector.result.file_error = Rejection(first, problem)
                return
            if row is not None and any(cell.strip() for cell in row):
                try:
                    header = _header(row)
                except _Invalid as error:
                    collector.result.file_error = Rejection(first, str(error))
                    return
            continue
        if problem:
            collector.reject(first, problem)
        elif row is None or not any(cell.strip() for cell in row):
            continue
        elif len(row) > len(header):
            collector.reject(first, f"{len(row)} cells, but the header names {len(header)} columns")
        else:
            collector.add(first, dict(zip(header, row, strict=False)))


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
            raise _Invalid(f"column {position} of the header has no name")
        if names.index(name) != position - 1:
            raise _Invalid(f'the header names the column "{name}" twice')
    missing = [required for required in ("sku", "title") if required not in names]
    if missing:
        hint = "; cells must be separated by commas" if any(";" in name for name in names) else ""
        raise _Invalid(
            f"the header must name the columns sku and title (missing: {', '.join(missing)}){hint}"
        )
    return names


# --- checking one record -------------------------------------------------------------------


class _Collector:
    def __init__(self) -> None:
        self.result = ParseResult()
        self.first_seen: dict[str, int] = {}

    def reject(self, line: int, message: str) -> None:
        self.result.errors.append(Rejection(line, message))

    def add(self, line: int, data: dict[str, object]) -> None:
        problems: list[str] = []
        values = normalise_keys(data, problems)
        sku = check_sku(values.pop("sku", None), problems)
        if sku is not None:
            if sku in self.first_seen:
                problems.append(f'sku "{sku}" appears again (first on line {self.first_seen[sku]})')
            else:
                self.first_seen[sku] = line
        title = check_title(values.pop("title", None), problems)
        status = _status(values.pop("status", None), problems)
        fields = check_fields(values, problems)
        if problems or sku is None or title is None:
            self.reject(line, "; ".join(problems))
        else:
            self.result.records.append(Record(line, sku, title, status, fields))


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


def text_problem(value: str) -> str | None:
    # PostgreSQL cannot store NUL, and a lone surrogate (JSON "\ud800") cannot be encoded at all.
    if "\x00" in value:
        return "contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an unpaired surrogate escape"
    return None


def _shown(value: str) -> str:
    return json.dumps(value if len(value) <= 70 else value[:70] + "…", ensure_ascii=False)


def check_sku(value: object, problems: list[str]) -> str | None:
    if value is not None and not isinstance(value, str):
        problems.append("sku must be text")
        return None
    sku = (value or "").strip()
    if not sku:
        problems.append("sku is missing")
        return None
    if not SKU_PATTERN.fullmatch(sku):
        problems.append(f"sku {_shown(sku)} is not valid ({SKU_RULE})")
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
        problems.append(f"status {_shown(value.strip())} is not valid (active or withdrawn)")
        return None
    return status


def check_fields(values: dict[str, object], problems: list[str]) -> dict[str, FieldValue]:
    """Every other key is a product field. Blank values (empty cells, "", null) are left out and
    text is stripped; inside a list or an object every value is kept as given."""
    fields: dict[str, FieldValue] = {}
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, str):
            value = value.strip()
            if not value:
                continue
        if (problem := json_value_problem(value, f'field "{name}"')) is not None:
            problems.append(problem)
        else:
            fields[name] = value
    return fields


def json_value_problem(value: object, field: str, *, max_depth: int = MAX_FIELD_DEPTH) -> str | None:
    """Why `value` cannot be stored as `field` (jsonb holds no NUL, JSON no NaN), or None."""
    return _value_problem(value, field, where=field, depth=0, max_depth=max_depth)


def _value_problem(value: object, field: str, *, where: str, depth: int, max_depth: int) -> str | None:
    if isinstance(value, str):
        problem = text_problem(value)
        return f"{where} {problem}" if problem else None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where} is not a finite number"
    if value is None or isinstance(value, bool | int):
        return None
    if not isinstance(value, list | dict):
        return f"{where} is not a JSON value"
    if depth == max_depth:
        return f"{field} nests lists and objects more than {max_depth} deep"
    if isinstance(value, list):
        for position, inner in enumerate(value, start=1):
            if problem := _value_problem(
                inner, field, where=f"{where}, item {position}", depth=depth + 1, max_depth=max_depth
            ):
                return problem
        return None
    for key, inner in value.items():
        if not isinstance(key, str) or (problem := text_problem(key)) is not None:
            return f"{where} has a key that {problem or 'is not text'}"
        if problem := _value_problem(
            inner, field, where=f"{where}, key {_shown(key)}", depth=depth + 1, max_depth=max_depth
        ):
            return problem
    return None
