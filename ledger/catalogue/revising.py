"""One product's content changed by a person (the API today), checked by the importer's rules
(`check_product_record`) before it is recorded: what a person sends is judged like a file's line."""

import io
import json
import time

from ..actions.products import ProductChange, record_product
from ..models import ProductStatus
from .checks import CheckedProduct, check_product_record
from .importing import import_catalogue
from .records import ImportReport

# A screen's estimate waits this long for an import that is writing, then says so.
ESTIMATE_WAIT_SECONDS = 2.0


class ProductRefused(ValueError):
    """The content breaks SPEC §7's rules; `problems` says where, as `CheckedProduct.problems`."""

    def __init__(self, checked: CheckedProduct):
        super().__init__(checked.words())
        self.problems = checked.problems


def revise_product(*, sku: str, title: str, fields: dict, actor=None) -> ProductChange:
    """New content for a product (a new revision only if the content changed). Status is not content:
    a product is withdrawn by `withdraw_product`."""
    checked = check_product_record({**fields, "sku": sku, "title": title})
    if checked.problems:
        raise ProductRefused(checked)
    return record_product(sku=checked.sku, title=checked.title, fields=checked.fields, actor=actor)


class ImportWriting(RuntimeError):
    """An import is writing the catalogue: an estimate would have to wait for it to finish."""


def estimate_revision(*, sku: str, title: str, fields: dict, withdraw: bool = False) -> ImportReport:
    """What revising one product (or, `withdraw`ing it) would do to unfinished jobs, counted and priced
    by the importer's own dry run of a one-line file (its items stopped, the products queued again
    and their estimated cost): the import screen's numbers, by the same rule. Nothing changes.
    Raises ImportWriting rather than wait more than ESTIMATE_WAIT_SECONDS for an import at work."""
    record = {**fields, "sku": sku, "title": title}
    if withdraw:
        record["status"] = ProductStatus.WITHDRAWN
    line = io.BytesIO(json.dumps(record, ensure_ascii=False).encode() + b"\n")
    started = time.monotonic()

    def waiting(report: ImportReport) -> None:
        if not report.rows_read and time.monotonic() - started > ESTIMATE_WAIT_SECONDS:
            raise ImportWriting("an import is writing the catalogue; try again when it is done")

    return import_catalogue(line, replace=True, dry_run=True, on_progress=waiting, recognise_lines=False)
