"""Recording result lines set-wise: a chunk of lines in one transaction, each kind of change written
by one statement for the whole chunk, with exactly the versions, events, states and anomalies
the row-at-a-time reference recorder writes one line at a time (tests/ledger/row_recorder.py;
tests/ledger/test_recording.py holds them side by side).
A chunk either commits whole or leaves nothing behind, so a killed worker repeats no line."""

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

import psycopg
from django.db import connection, models, transaction
from django.db.models import Exists, F, OuterRef, Subquery
from django.utils import timezone

from ..database.setwise import among, next_id_sql
from ..drafts.validation import DraftChecker, source_text_of
from ..models import (
    Event,
    GeneratedVersion,
    Item,
    Product,
    ProductStatus,
    SourceRevision,
    Submission,
    SubmissionItem,
    canonical_json,
    compact_json,
    content_hash,
)
from ..providers.base import ResultLine
from ..states import ItemState, ReasonCode
from .core import backoff, enqueue
from .jobs import judge_currency

# Transient inference failures are retried this many times in all before the item is given up.
MAX_INFERENCE_ATTEMPTS = 3
# An item stopped while its request was out still had its answer paid for: the draft is kept as
# evidence, and its cost counts as wasted.
STOPPED_STATES = (ItemState.OBSOLETE, ItemState.WITHDRAWN, ItemState.CANCELLED)


@dataclass(frozen=True, slots=True)
class Entry:
    """A request of the unit, locked with its item for the chunk."""

    pk: int
    custom_id: str
    outcome: str
    item_id: int
    state: str
    inference_failures: int
    source_revision_id: int
    # Its product is active and this is its current revision (`currency_problem` is None).
    current: bool
    # The number of its item's latest version (0: none yet).
    last_number: int


def record_chunk(
    submission: Submission, stream: Sequence, *, checker: DraftChecker, checks: dict | None = None
) -> None:
    """Record a chunk of what a results stream gave, in the order it was read: `ResultLine`s
    (custom_ids not repeated within the collection) and anomalies already known (dicts: an
    unreadable or repeated line). One transaction. `checks`: the `checked_draft` of drafts
    checked already, by custom_id (a collection checks each as it reads it)."""
    lines = [line for line in stream if isinstance(line, ResultLine)]
    # Read beside the lock, not locked: a product is never held by a collection.
    current = Product.objects.filter(
        pk=OuterRef("item__product_id"),
        status=ProductStatus.ACTIVE,
        current_revision_id=OuterRef("item__source_revision_id"),
    )
    last_version = GeneratedVersion.objects.filter(item_id=OuterRef("item_id")).order_by("-number")
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                # A chunk lost with the database server (not with a worker) is simply read and
                # recorded again: the entries it marked are lost with it. The collection's last
                # commit waits for all of them. And the rows a chunk reads and writes are a few
                # thousand, each found by its key in memory: the default cost of a random read (a
                # spinning disk's) has the planner scan and hash whole tables of items instead.
                cursor.execute("SET LOCAL synchronous_commit TO OFF; SET LOCAL random_page_cost = 1.1")
        rows = (
            # Rows that stay referenced (events and versions point at items): locked against other
            # changes, not against rows that refer to them.
            SubmissionItem.objects.select_for_update(no_key=True)
            .filter(among("custom_id", [line.custom_id for line in lines]), submission_id=submission.pk)
            .order_by("item_id")
            .annotate(current=Exists(current), last_number=Subquery(last_version.values("number")[:1]))
            .values_list(
                "pk",
                "custom_id",
                "outcome",
                "item_id",
                "item__state",
                "item__inference_failures",
                "item__source_revision_id",
                "current",
                "last_number",
            )
        )
        entries = {
            custom_id: Entry(
                pk,
                custom_id,
                outcome,
                item,
                state,
                failures,
                revision,
                current=current,
                last_number=last_number or 0,
            )
            for pk, custom_id, outcome, item, state, failures, revision, current, last_number in rows
        }
        anomalies = [
            part
            if isinstance(part, dict)
            else {"kind": "unknown_custom_id", "custom_id": part.custom_id[:100]}
            for part in stream
            if isinstance(part, dict) or part.custom_id not in entries
        ]
        fresh = [
            (entries[line.custom_id], line)
            for line in lines
            if line.custom_id in entries and not entries[line.custom_id].outcome
        ]
        drafts = [(entry, line) for entry, line in fresh if line.succeeded]
        failures = [(entry, line) for entry, line in fresh if not line.succeeded]
        for outcome, recorded in (("returned", drafts), ("failed", failures)):
            if recorded:
                SubmissionItem.objects.filter(among("pk", [entry.pk for entry, _ in recorded])).update(
                    outcome=outcome
                )
        # Every event of the chunk is written by one statement, each item's in the order they
        # happen; then the items whose product changed meanwhile are judged, after them.
        events: list[tuple] = []
        stale = record_drafts(submission, drafts, events, checker=checker, checks=checks or {})
        stale += record_failures(submission, failures, events)
        insert_events(submission, events)
        # Judged one by one, as the row-at-a-time recorder does: a product that changed meanwhile is rare.
        for item in Item.objects.filter(pk__in=stale).order_by("pk"):
            judge_currency(item)
        note_anomalies(submission, anomalies)


# A version's columns that depend on its draft alone (`CheckedDraft.values`), after `NewVersion`'s.
DRAFT_COLUMNS = (
    "custom_id",
    "content",
    "raw_output",
    "content_hash",
    "input_tokens",
    "output_tokens",
    "usage",
    "validation_notes",
)


class NewVersion(NamedTuple):
    """A version about to be written: its own columns (`id` None where the database gives it), and
    its draft, which holds the rest (DRAFT_COLUMNS)."""

    id: int | None
    item_id: int
    number: int
    submission_id: int
    valid: bool
    validation_reasons: list
    created_at: datetime
    draft: "CheckedDraft"


# The columns of a row `insert_versions` writes with COPY, in its order.
VERSION_COLUMNS = (
    "id",
    "item_id",
    "number",
    "submission_id",
    "valid",
    "validation_reasons",
    "created_at",
    *DRAFT_COLUMNS,
)


@dataclass(frozen=True, slots=True)
class CheckedDraft:
    """What depends on one draft alone: its checks (`DraftChecker.check`) and its version's
    DRAFT_COLUMNS, as values and as the end of a line of COPY's text format. Worked out before its
    chunk is recorded: a collection does it as it reads, beside the recording of the chunk before."""

    text: str
    reasons: list
    claimed: list
    values: tuple
    copy_end: str

    @property
    def custom_id(self) -> str:
        return self.values[0]


def kept_answer(answer: str, text: str) -> str:
    """A version's raw_output: the answer as returned, unless it is the draft's text itself (one
    copy of an answer at most; `GeneratedVersion.answer` reads either)."""
    return "" if answer == text else answer


def checked_draft(checker: DraftChecker, line) -> CheckedDraft:
    text, reasons, claimed, notes = checker.check(line.content, truncated=line.truncated)
    usage = {**line.usage, "apportioned": True} if line.apportioned else line.usage
    digest = content_hash(text)
    raw_output = kept_answer(line.content, text)
    return CheckedDraft(
        text,
        reasons,
        claimed,
        (line.custom_id, text, raw_output, digest, line.input_tokens, line.output_tokens, usage, notes),
        f"{escaped(line.custom_id)}\t{escaped(text)}\t{escaped(raw_output)}\t{digest}\t"
        f"{line.input_tokens}\t{line.output_tokens}\t{escaped(compact_json(usage))}\t{compact_json(notes)}\n",
    )


def record_drafts(
    submission: Submission, drafts: list, events: list, *, checker: DraftChecker, checks: dict
) -> list[int]:
    """Versions for the drafts of items waiting for them (or stopped meanwhile: kept as
    evidence), checked, and each waiting item moved on: returned, then awaiting review or
    validation failed, or obsolete or withdrawn when its product changed meanwhile (rule 5).
    Adds the events to `events`; returns the items whose product changed meanwhile, to be judged."""
    kept = [(entry, line) for entry, line in drafts if entry.state in (ItemState.SUBMITTED, *STOPPED_STATES)]
    if not kept:
        return []
    checked = [(entry, checks.get(line.custom_id) or checked_draft(checker, line)) for entry, line in kept]
    # The sources of only the drafts that claim something are read, all in one query.
    claiming = {entry.source_revision_id for entry, draft in checked if draft.claimed}
    sources = {
        pk: source_text_of(title, fields)
        for pk, title, fields in SourceRevision.objects.filter(pk__in=claiming).values_list(
            "pk", "title", "fields"
        )
    }
    now = timezone.now()
    # Each version's id from the table's sequence, if any.
    ids = reserved_ids(GeneratedVersion, len(checked)) or [None] * len(checked)
    versions, judged = [], []
    for pk, (entry, draft) in zip(ids, checked, strict=True):
        reasons = draft.reasons
        if draft.claimed:
            reasons = reasons + checker.unstated(draft.claimed, draft.text, sources[entry.source_revision_id])
        versions.append(
            NewVersion(
                id=pk,
                item_id=entry.item_id,
                number=entry.last_number + 1,
                submission_id=submission.pk,
                valid=not reasons,
                validation_reasons=[str(r) for r in reasons],
                created_at=now,
                draft=draft,
            )
        )
        if entry.state == ItemState.SUBMITTED:
            judged.append((entry, draft.custom_id, reasons))
    insert_versions(versions)
    if not judged:
        return []
    if ids[0] is not None:
        version_of = {version.draft.custom_id: version.id for version in versions}
    else:
        version_of = dict(
            GeneratedVersion.objects.filter(among("custom_id", [custom_id for _, custom_id, _ in judged]))
            .order_by()
            .values_list("custom_id", "pk")
        )
    stale, valid, invalid = [], [], defaultdict(list)
    for entry, custom_id, reasons in judged:
        version = {"version": version_of[custom_id]}
        events.append((entry.item_id, ItemState.SUBMITTED, ItemState.RETURNED, "", version))
        if not entry.current:
            stale.append(entry.item_id)
        elif reasons:
            reason = "; ".join(reasons)
            invalid[(reason, reasons[0].code)].append(entry.item_id)
            # The reasons' codes: a pilot's report counts failures by reason (ledger/pilots/measure.py).
            codes = {"codes": [r.code for r in reasons]}
            events.append((entry.item_id, ItemState.RETURNED, ItemState.VALIDATION_FAILED, reason, codes))
        else:
            valid.append(entry.item_id)
            events.append((entry.item_id, ItemState.RETURNED, ItemState.AWAITING_REVIEW, "", version))
    move_waiting(stale, to=ItemState.RETURNED)
    move_waiting(valid, to=ItemState.AWAITING_REVIEW)
    for (reason, code), item_ids in invalid.items():
        move_waiting(item_ids, to=ItemState.VALIDATION_FAILED, reason=reason, code=code)
    return stale


def insert_versions(versions: list[NewVersion]) -> None:
    """Drafts in one statement: on PostgreSQL a `COPY` of rows formatted here, elsewhere
    `bulk_create` (ids given by the database)."""
    if not versions:
        return
    if connection.vendor != "postgresql":
        GeneratedVersion.objects.bulk_create(
            GeneratedVersion(
                **{name: value for name, value in version._asdict().items() if name not in ("id", "draft")},
                **dict(zip(DRAFT_COLUMNS, version.draft.values, strict=True)),
            )
            for version in versions
        )
        return
    at = versions[0].created_at.isoformat()
    copy_text(
        GeneratedVersion,
        list(VERSION_COLUMNS),
        "".join(
            f"{version.id}\t{version.item_id}\t{version.number}\t{version.submission_id}\t"
            f"{'t' if version.valid else 'f'}\t{escaped(compact_json(version.validation_reasons))}\t"
            f"{at}\t{version.draft.copy_end}"
            for version in versions
        ),
    )


def record_failures(submission: Submission, failures: list, events: list) -> list[int]:
    """Each waiting item whose request failed: inference failed with the provider's reason, then,
    when the failure is transient, retried alone (or given up after MAX_INFERENCE_ATTEMPTS).
    Adds the events to `events`; returns the retried items whose product changed meanwhile, to be
    judged."""
    now = timezone.now()
    moves = defaultdict(list)
    stale = []
    for entry, line in failures:
        if entry.state != ItemState.SUBMITTED:
            continue
        reason = f"{line.error_code}: {line.error_message}".strip(": ")
        code = line.reason or ReasonCode.MODEL_FAILED
        failures_now = entry.inference_failures + 1
        data = {"custom_id": line.custom_id, "transient": line.transient}
        events.append((entry.item_id, ItemState.SUBMITTED, ItemState.INFERENCE_FAILED, reason, data))
        if not entry.current:
            stale.append(entry.item_id)
        if not line.transient:
            moves[(ItemState.INFERENCE_FAILED, reason, code, None)].append(entry.item_id)
        elif failures_now >= MAX_INFERENCE_ATTEMPTS:
            given_up = f"Gave up after {failures_now} attempts: {reason}"
            events.append((entry.item_id, ItemState.INFERENCE_FAILED, ItemState.DEAD_LETTER, given_up, {}))
            moves[(ItemState.DEAD_LETTER, given_up, code, None)].append(entry.item_id)
        else:
            retry = f"Automatic retry after {reason}"
            delay = backoff(failures_now, line.retry_after)
            events.append((entry.item_id, ItemState.INFERENCE_FAILED, ItemState.PREPARED, retry, {}))
            moves[(ItemState.PREPARED, retry, "", now + delay if delay else None)].append(entry.item_id)
    retried = []
    for (state, reason, code, next_attempt_at), item_ids in moves.items():
        fields = {"inference_failures": F("inference_failures") + 1}
        if state == ItemState.PREPARED:
            fields |= {
                "inference_attempt": F("inference_attempt") + 1,
                "submission": None,
                "approved_version": None,
                "next_attempt_at": next_attempt_at,
            }
            retried += item_ids
        Item.objects.filter(among("pk", item_ids), state=ItemState.SUBMITTED).update(
            state=state, reason=reason, reason_code=code, updated_at=now, **fields
        )
    if not retried:
        return []
    # A retried item whose product changed meanwhile stops instead (like retry_inference).
    stale_retried = sorted(set(stale) & set(retried))
    if len(stale_retried) < len(retried):
        enqueue("ledger.tasks.submit_job", submission.job_id)
    return stale_retried


def move_waiting(item_ids: list[int], *, to: str, **reason) -> None:
    """Items still waiting for their result (locked with their entries) take their next state."""
    if item_ids:
        Item.objects.filter(among("pk", item_ids), state=ItemState.SUBMITTED).update(
            state=to,
            reason=reason.get("reason", ""),
            reason_code=reason.get("code", ""),
            updated_at=timezone.now(),
        )


def insert_events(submission: Submission, events: list[tuple]) -> None:
    """(item, from, to, reason, data) events of the submission's job, written by the system, in
    one statement: on PostgreSQL a `COPY` of rows formatted here (a chunk writes two events a
    draft), elsewhere `bulk_create`."""
    if not events:
        return
    now = timezone.now()
    if connection.vendor != "postgresql":
        Event.objects.bulk_create(
            Event(
                item_id=item_id,
                job_id=submission.job_id,
                from_state=from_state,
                to_state=to,
                reason=reason,
                data=data,
                at=now,
            )
            for item_id, from_state, to, reason, data in events
        )
        return
    at, job = now.isoformat(), submission.job_id
    # States are machine names; only the reason and the data may hold what COPY's text escapes.
    copy_text(
        Event,
        ["item_id", "job_id", "from_state", "to_state", "actor_name", "reason", "data", "at"],
        "".join(
            f"{item_id}\t{job}\t{from_state}\t{to}\tsystem\t{escaped(reason)}\t{escaped(compact_json(data))}\t{at}\n"
            for item_id, from_state, to, reason, data in events
        ),
    )


def escaped(text: str) -> str:
    """`text` as a value of COPY's text format."""
    if "\\" in text:
        text = text.replace("\\", "\\\\")
    if "\t" in text or "\n" in text or "\r" in text:
        text = text.replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return text


def copy_text(model: type[models.Model], names: list[str], text: str) -> None:
    """COPY's text format (a row a line, values tab-separated, escaped) into these fields of the
    model's table, on the transaction's own connection."""
    columns = ", ".join(connection.ops.quote_name(model._meta.get_field(name).column) for name in names)
    connection.ensure_connection()
    with (
        psycopg.Cursor(connection.connection) as cursor,
        cursor.copy(f"COPY {connection.ops.quote_name(model._meta.db_table)} ({columns}) FROM STDIN") as copy,
    ):
        copy.write(text)


def reserved_ids(model: type[models.Model], count: int) -> list[int]:
    """On PostgreSQL, `count` ids taken from the table's own sequence for rows about to be written
    (so what refers to them is written without reading them back); elsewhere none."""
    if connection.vendor != "postgresql" or not count:
        return []
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {next_id_sql(model)} FROM generate_series(1, %s)", [count])
        return [pk for (pk,) in cursor.fetchall()]


def note_anomalies(submission: Submission, anomalies: list[dict]) -> None:
    """Add these to what collection could not match (each kind and subject once, in order)."""
    if not anomalies:
        return
    locked = Submission.objects.select_for_update().get(pk=submission.pk)
    known = {canonical_json(anomaly) for anomaly in locked.anomalies}
    added = False
    for anomaly in anomalies:
        key = canonical_json(anomaly)
        if key not in known:
            known.add(key)
            locked.anomalies.append(anomaly)
            added = True
    if added:
        Submission.objects.filter(pk=submission.pk).update(anomalies=locked.anomalies)
