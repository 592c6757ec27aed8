"""Files uploaded on the import screen: kept in the database, imported by a worker (one claim, safe
to run twice), with their progress and report.
"""

import logging
import secrets
import threading
from dataclasses import asdict
from datetime import timedelta
from decimal import Decimal
from functools import partial

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.db import connection, connections, transaction
from django.db.models import Q
from django.utils import timezone
from django_q.tasks import async_task

from ..models import (
    CatalogueImport,
    CatalogueImportChunk,
    ImportState,
)
from ..workers.stopping import stop_asked
from .importing import DryRun, import_catalogue
from .reading import StoredFile
from .records import ImportReport, JobRework, Rejection, Unreadable

log = logging.getLogger(__name__)


# An upload is kept in rows of this size; a worker reads one at a time.
UPLOAD_CHUNK_BYTES = 1024 * 1024


# A worker's claim silent this long is taken to be dead, and another worker may take it over.
IMPORT_STALE_AFTER = timedelta(minutes=10)


# How long a worker may spend on one import before django-q stops it (the cluster's default is
# for short tasks).
IMPORT_TIMEOUT_SECONDS = 6 * 3600


# Progress is written at most this often.
_PROGRESS_EVERY = timedelta(seconds=1)


def store_upload(
    upload: UploadedFile,
    *,
    uploaded_by,
    skip_invalid: bool,
    replace: bool = False,
    preview_first: bool = False,
) -> CatalogueImport:
    """Keep an uploaded file in the database, where a worker on any machine can read it, and queue
    its import. The worker stops at a preview, changing nothing, when the import would queue paid
    work again or `preview_first` asks for one: the person confirms it (`confirm_import`) or not."""
    with transaction.atomic():
        stored = CatalogueImport.objects.create(
            file_name=(upload.name or "")[:255],
            size=upload.size,
            skip_invalid=skip_invalid,
            replace=replace,
            preview_first=preview_first,
            uploaded_by=uploaded_by,
            progress_at=timezone.now(),
        )
        for number, data in enumerate(upload.chunks(UPLOAD_CHUNK_BYTES)):
            CatalogueImportChunk.objects.create(catalogue_import=stored, number=number, data=data)
        # Once committed. A broker that cannot take the task (Redis down) leaves the import
        # queued, for the collector's pass to queue again (`queue_lost_imports`).
        transaction.on_commit(partial(_queue_task, stored.pk), robust=True)
    return stored


def confirm_import(import_id: int, *, confirmed_by, requeues_seen: int | None) -> bool:
    """The person saw the preview and wants the import: queued again, to be imported for real unless
    it would now queue more paid work than the preview showed (then it stops at a new preview).
    `requeues_seen` is the count of items queued again that the person's page showed (rule 15): a
    preview made again since (a first confirmation found more work at stake) is not confirmed by a
    form sent from the page of the earlier one. False when nothing was confirmed: not waiting for
    confirmation (confirmed or discarded already), or not the preview the person saw."""
    with transaction.atomic():
        stored = (
            CatalogueImport.objects.select_for_update()
            .filter(pk=import_id, state=ImportState.PREVIEWED)
            .first()
        )
        if stored is None:
            return False
        requeues = report_of(stored).items_requeued
        if requeues != requeues_seen:
            return False
        confirmed = CatalogueImport.objects.filter(pk=import_id, state=ImportState.PREVIEWED).update(
            state=ImportState.QUEUED,
            confirmed_by=confirmed_by,
            confirmed_at=timezone.now(),
            confirmed_requeues=requeues,
            claimed_by="",
            progress_at=timezone.now(),
            rows_written=0,
        )
        if confirmed:
            transaction.on_commit(partial(_queue_task, import_id), robust=True)
    return bool(confirmed)


def discard_import(import_id: int) -> bool:
    """The person does not want a previewed import: nothing of it is kept but its report."""
    with transaction.atomic():
        discarded = CatalogueImport.objects.filter(pk=import_id, state=ImportState.PREVIEWED).update(
            state=ImportState.DISCARDED, finished_at=timezone.now()
        )
        if discarded:
            CatalogueImportChunk.objects.filter(catalogue_import_id=import_id).delete()
    return bool(discarded)


def _needs_confirmation(stored: CatalogueImport, report: ImportReport) -> bool:
    """Rule 16: nothing paid is queued from an import before the person has seen its count and cost."""
    if stored.confirmed_at is None:
        return stored.preview_first or report.items_requeued > 0
    return report.items_requeued > (stored.confirmed_requeues or 0)


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

    def finish_if_confirmed(report: ImportReport) -> None:
        # The catalogue may have changed since the dry run or the preview the person confirmed.
        if _needs_confirmation(stored, report):
            raise DryRun
        finish(report)

    options = {"skip_invalid": stored.skip_invalid, "replace": stored.replace, "on_progress": on_progress}
    try:
        report = None
        if stored.confirmed_at is None:
            # A dry run first: quick (no item is judged), and it says whether paid work would be queued.
            report = import_catalogue(StoredFile(stored), dry_run=True, **options)
            if not report.stops(stored.skip_invalid) and not _needs_confirmation(stored, report):
                report = None  # nothing to confirm: imported at once
        if report is None:
            report = import_catalogue(StoredFile(stored), before_commit=finish_if_confirmed, **options)
        if report.stops(stored.skip_invalid):  # refused: nothing was written, `finish` was not called
            with transaction.atomic():
                finish(report)
        elif report.dry_run:  # rolled back: the file is kept for the person to confirm
            if not mine.update(state=ImportState.PREVIEWED, **_report_values(report)):
                return "taken over"
            return ImportState.PREVIEWED
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
        "changes": {
            "changed_fields": report.changed_fields,
            "revisions": report.revisions,
            "rework": [_rework_values(job) for job in report.rework.values()],
        },
    }


def _rework_values(job: JobRework) -> dict:
    values = asdict(job)
    del values["sample"]  # only for the estimate
    return {**values, "cost": None if job.cost is None else str(job.cost)}


def report_of(stored: CatalogueImport) -> ImportReport:
    """The report of a finished import, as `import_catalogue` returned it."""
    errors = [
        (Unreadable if unreadable else Rejection)(line, message)
        for line, message, unreadable in stored.errors
    ]
    changes = stored.changes or {}
    rework = {}
    for job in changes.get("rework", []):
        cost = None if job["cost"] is None else Decimal(job["cost"])
        rework[job["job_id"]] = JobRework(**{**job, "cost": cost})
    return ImportReport(
        **stored.counts,
        replace=stored.replace,
        dry_run=stored.state == ImportState.PREVIEWED,
        changed_fields=changes.get("changed_fields", {}),
        revisions=[(sku, fields) for sku, fields in changes.get("revisions", [])],
        rework=rework,
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
