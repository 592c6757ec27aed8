"""What the catalogue importer hands from step to step: a file's lines, its checked records and
rejections, the rows staged for writing, and the report of an import (SPEC §7).
"""

import json
import os
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import NamedTuple, Protocol

from ..drafts.json_values import FieldValue
from ..models import SourceRevision

MAX_RECORD_BYTES = 65536


MAX_TITLE_LENGTH = 300


SKU_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


SKU_RULE = "letters, digits, . _ - ; at most 64"


# A report (on the screen, from the command) lists this many problems and counts the rest.
MAX_REPORTED_ERRORS = 100
# A report names the fields changed by this many revisions, and counts the fields of all of them.
MAX_REPORTED_REVISIONS = 100


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
    # The fields the row names with a blank value: an existing product's are removed (SPEC §7).
    # A field the row does not name at all is left as it is, unless the import replaces whole records.
    cleared: tuple[str, ...] = ()


class Rejection(NamedTuple):
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class Unreadable(Rejection):
    """The file as a whole cannot be read (a CSV header without sku or title, say)."""


@dataclass
class JobRework:
    """What an import does to one unfinished job: its items of revised products become obsolete (at
    once, or when their result returns) and each such product's current revision is queued again in
    it, paid for again (`requeued`, one a product); its items of withdrawn products are withdrawn.
    `cost` is the estimate of the work queued again, in the provider's currency (USD), None without
    a known price."""

    job_id: int
    reference: str = ""
    obsolete: int = 0
    requeued: int = 0
    withdrawn: int = 0
    cost: Decimal | None = None
    price_note: str = ""
    # What the estimate's tokens rest on, in words (`ledger.money.estimates`): measured, or the template.
    estimate_source: str = ""
    # A few of the products queued again, (title, fields), to estimate the size of their prompts.
    sample: list[tuple[str, dict]] = field(default_factory=list, repr=False)


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
    # Unchanged rows recognised by their line alone (met before, see `KnownLines`).
    recognised: int = 0
    # Whether each record was the product's whole content, and whether nothing was kept at all.
    replace: bool = False
    dry_run: bool = False
    # How many revisions change each field ("title" too), and the fields of the first revisions.
    changed_fields: dict[str, int] = field(default_factory=dict)
    revisions: list[tuple[str, list[str]]] = field(default_factory=list)
    # The unfinished jobs whose items the revisions and withdrawals stop, by job id.
    rework: dict[int, JobRework] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        return (
            f"created {self.created}, revised {self.revised}, unchanged {self.unchanged}, "
            f"withdrawn {self.withdrawn}, rejected {self.rejected}"
        )

    @property
    def items_obsolete(self) -> int:
        return sum(job.obsolete for job in self.rework.values())

    @property
    def items_requeued(self) -> int:
        return sum(job.requeued for job in self.rework.values())

    @property
    def items_withdrawn(self) -> int:
        return sum(job.withdrawn for job in self.rework.values())

    @property
    def requeue_cost(self) -> Decimal | None:
        """The estimated cost of the work queued again (USD), of the jobs whose price is known."""
        costs = [job.cost for job in self.rework.values() if job.cost is not None]
        return sum(costs, Decimal(0)) if costs else None

    @property
    def unpriced_requeues(self) -> int:
        return sum(job.requeued for job in self.rework.values() if job.requeued and job.cost is None)

    @property
    def changed_fields_by_count(self) -> list[tuple[str, int]]:
        """(field, revisions changing it), the most changed first."""
        return sorted(self.changed_fields.items(), key=lambda pair: (-pair[1], pair[0]))

    @property
    def unlisted_revisions(self) -> int:
        return self.revised - len(self.revisions)

    def add_revision(self, sku: str, fields: list[str]) -> None:
        for name in fields:
            self.changed_fields[name] = self.changed_fields.get(name, 0) + 1
        if len(self.revisions) < MAX_REPORTED_REVISIONS:
            self.revisions.append((sku, fields))

    def job_rework(self, job_id: int) -> JobRework:
        return self.rework.setdefault(job_id, JobRework(job_id))

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
        self.changed_fields, self.revisions, self.rework = {}, [], {}

    def add_error(self, error: Rejection) -> None:
        self.error_count += 1
        self.rejected += not isinstance(error, Unreadable)
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append(error)


class Line(NamedTuple):
    number: int
    # Decoded text ending in "\n" (what the csv module reads); "\n" alone when unreadable.
    text: str
    size: int
    problem: str | None
    # `line_digest` of the line's bytes, when the import recognises lines (see KnownLines).
    digest: bytes | None = None


class Staged(NamedTuple):
    record: Record  # its fields None when read for an import (`stage_rows`): written from `fields`
    fields: str  # JSON
    content_hash: str
    line_digest: bytes | None = None  # when the import recognises lines: the line's


class Recognised(NamedTuple):
    """A line met before: the one that made its product what it is now. Nothing to write."""

    line: int
    product_id: int
    digest: bytes


def _staged(row: Record | Rejection, keep_fields: bool = True) -> "Staged | Rejection":
    if isinstance(row, Rejection):
        return row
    # The hash is record_product's own, so a product staged here and one recorded alone agree.
    content_hash = SourceRevision.hash_content(row.title, row.fields)
    return Staged(row if keep_fields else row._replace(fields=None), json.dumps(row.fields), content_hash)
