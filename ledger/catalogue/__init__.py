"""Catalogue files (SPEC §7): read JSONL or CSV into checked records, then import them.

One module per concern: `records` (what each step hands on, and the report), `reading` and
`usual_rows` (a file's lines into records), `checks` (one record's rules, `check_product_record`,
for the importer, the API and `revise_product`), `digests` (SKUs and lines an import remembers),
`merging` (a chunk merged with the products as they are and written set-wise), `rework` (the paid
work an import queues again, estimated), `revising` (one product's content from a person, checked as
a line is), `importing` (the one transaction, or a dry run) and `uploads` (files from the import
screen, imported by a worker, previewed and confirmed). The rules of a JSON value that the API and
prompts share are in `ledger.drafts.json_values`.
"""

from .checks import CheckedProduct, check_fields, check_product_record, check_sku, check_title, normalise_keys
from .importing import import_catalogue
from .reading import StoredFile, read_catalogue
from .records import (
    MAX_RECORD_BYTES,
    MAX_REPORTED_ERRORS,
    MAX_TITLE_LENGTH,
    SKU_PATTERN,
    SKU_RULE,
    ImportReport,
    Record,
    Rejection,
    Unreadable,
)
from .revising import ImportWriting, ProductRefused, estimate_revision, revise_product
from .uploads import (
    IMPORT_STALE_AFTER,
    IMPORT_TIMEOUT_SECONDS,
    UPLOAD_CHUNK_BYTES,
    confirm_import,
    discard_import,
    queue_lost_imports,
    report_of,
    run_stored_import,
    store_upload,
)

__all__ = [
    "CheckedProduct",
    "ImportWriting",
    "ProductRefused",
    "estimate_revision",
    "check_product_record",
    "revise_product",
    "IMPORT_STALE_AFTER",
    "IMPORT_TIMEOUT_SECONDS",
    "MAX_RECORD_BYTES",
    "MAX_REPORTED_ERRORS",
    "MAX_TITLE_LENGTH",
    "SKU_PATTERN",
    "SKU_RULE",
    "UPLOAD_CHUNK_BYTES",
    "ImportReport",
    "Record",
    "Rejection",
    "StoredFile",
    "Unreadable",
    "check_fields",
    "check_sku",
    "check_title",
    "confirm_import",
    "discard_import",
    "import_catalogue",
    "normalise_keys",
    "queue_lost_imports",
    "read_catalogue",
    "report_of",
    "run_stored_import",
    "store_upload",
]
