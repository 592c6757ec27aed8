"""The row-at-a-time recorder: one result line matched and recorded in its own transaction. Collection
records lines a chunk at a time (`ledger.actions.recording.record_chunk`); this is the reference its
outcome is tested against (tests/ledger/test_recording.py holds them side by side), and the shortest
way for a test to record one line."""

from django.db import transaction
from django.db.models import Max

from ledger.actions.collecting import retry_inference
from ledger.actions.core import backoff, change_state
from ledger.actions.jobs import judge_currency
from ledger.actions.recording import MAX_INFERENCE_ATTEMPTS, kept_answer
from ledger.actions.submitting import note_anomaly
from ledger.drafts.validation import check_draft
from ledger.models import GeneratedVersion, Item, Submission, SubmissionItem, content_hash
from ledger.providers import schema_dialect
from ledger.states import ItemState, ReasonCode


def record_result(submission: Submission, line, *, seen: set[str] | None = None) -> str:
    """Match one result line by custom_id and record it. A repeated line makes no second version."""
    seen = seen if seen is not None else set()
    if line.custom_id in seen:
        note_anomaly(submission, "repeated_line", custom_id=line.custom_id)
        return "repeated"
    seen.add(line.custom_id)
    with transaction.atomic():
        entry = (
            SubmissionItem.objects.select_for_update()
            .filter(submission=submission, custom_id=line.custom_id)
            .select_related("item")
            .first()
        )
        if entry is None:
            note_anomaly(submission, "unknown_custom_id", custom_id=line.custom_id[:100])
            return "unknown"
        if entry.outcome:
            return "already recorded"
        item = entry.item
        if line.succeeded:
            entry.outcome = "returned"
            entry.save(update_fields=["outcome"])
            return record_version(item, submission, line)
        entry.outcome = "failed"
        entry.save(update_fields=["outcome"])
        return record_failure(item, line)


def record_version(item: Item, submission: Submission, line) -> str:
    # An item stopped while its request was out (its product changed, its job was cancelled) still
    # had its answer paid for: the draft is kept as evidence, and its cost counts as wasted.
    stopped = item.state in (ItemState.OBSOLETE, ItemState.WITHDRAWN, ItemState.CANCELLED)
    if item.state != ItemState.SUBMITTED and not stopped:
        return f"item is {item.state}"
    number = (item.versions.aggregate(n=Max("number"))["n"] or 0) + 1
    prompt = item.job.prompt_version
    text, reasons, _, notes = check_draft(
        prompt=prompt,
        revision=item.source_revision,
        output=line.content,
        truncated=line.truncated,
        dialect=schema_dialect(submission.provider),
    )
    # The entry row is locked and had no outcome, so this custom_id has no version yet; a unique
    # violation here would be a bug, and rolls the whole line back rather than hide it.
    version = GeneratedVersion.objects.create(
        item=item,
        number=number,
        custom_id=line.custom_id,
        submission=submission,
        content=text,
        raw_output=kept_answer(line.content, text),
        content_hash=content_hash(text),
        input_tokens=line.input_tokens,
        output_tokens=line.output_tokens,
        usage={**line.usage, "apportioned": True} if line.apportioned else line.usage,
        valid=not reasons,
        validation_reasons=reasons,
        validation_notes=notes,
    )
    if stopped:
        return f"kept as evidence: item is {item.state}"
    change_state(item.pk, to=ItemState.RETURNED, data={"version": version.pk})
    if judge_currency(item):
        return "not current"
    if reasons:
        reason, codes = "; ".join(reasons), {"codes": [r.code for r in reasons]}
        change_state(item.pk, to=ItemState.VALIDATION_FAILED, reason=reason, code=reasons[0].code, data=codes)
        return ItemState.VALIDATION_FAILED
    change_state(item.pk, to=ItemState.AWAITING_REVIEW, data={"version": version.pk})
    return ItemState.AWAITING_REVIEW


def record_failure(item: Item, line) -> str:
    if item.state != ItemState.SUBMITTED:
        return f"item is {item.state}"
    # The adapter translated the provider's words into the ledger's: a reason code and whether
    # the failure is transient (SPEC rule 8).
    transient = line.transient
    reason = f"{line.error_code}: {line.error_message}".strip(": ")
    code = line.reason or ReasonCode.MODEL_FAILED
    failures = item.inference_failures + 1
    change_state(
        item.pk,
        to=ItemState.INFERENCE_FAILED,
        reason=reason,
        code=code,
        data={"custom_id": line.custom_id, "transient": transient},
        inference_failures=failures,
    )
    if not transient:
        return "failed permanently"
    if failures >= MAX_INFERENCE_ATTEMPTS:
        change_state(
            item.pk,
            to=ItemState.DEAD_LETTER,
            reason=f"Gave up after {failures} attempts: {reason}",
            code=code,
        )
        return ItemState.DEAD_LETTER
    retry_inference(
        item.pk, reason=f"Automatic retry after {reason}", delay=backoff(failures, line.retry_after)
    )
    return "retrying"
