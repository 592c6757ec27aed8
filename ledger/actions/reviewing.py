"""Reviewing: approving one specific version, with the reviewer's edits judged like a draft, or
rejecting a draft (rules 6 and 15)."""

import uuid
from datetime import timedelta

import jsonschema
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from ..drafts.reasons import Reason, schema_reason
from ..drafts.validation import DraftChecker, read_draft, source_text
from ..models import Approval, Comment, Event, GeneratedVersion, Item, Job, PromptVersion, SourceRevision
from ..states import DECIDABLE_STATES, STOPS, ItemState, JobState, ReasonCode
from . import claims
from .core import NotAllowed, change_state, enqueue
from .job_states import refresh_job_state
from .jobs import create_job, currency_problem, judge_currency


class EditRefused(NotAllowed):
    """The edited text fails a check a draft must pass (or is empty); `reasons` says which. Nothing
    was changed."""

    def __init__(self, reasons: list[str]):
        self.reasons = reasons
        super().__init__("The edited text cannot be approved: " + "; ".join(reasons))


INVALID_DRAFT = "Only a valid draft can be approved; an edited text that passes every check may be"
EMPTY_EDIT = "The edited text is empty: write the text to publish, or approve the draft as it is"
# The approval's event when an owner's valid edit repaired an unusable draft.
REPAIRED = "Edited into a text that passes every check and approved (the generated draft was unusable)"


def edit_reasons(
    *, prompt: PromptVersion, revision: SourceRevision, version: GeneratedVersion, text: str
) -> list[Reason]:
    """Why an edited final text may not be published, judged as the draft it replaces was (rule 15):
    the output schema, the length rules and the claims against the source revision, in the same
    words (`drafts.reasons`).

    With a `text_field`, the edit stands in for that field of the draft's answer, and only what the
    schema says about that field counts (the rest of the answer is never published); without one,
    the edit is the whole answer and is checked as one. A person's text was asked for in no schema
    dialect: a null they write is theirs, judged by the schema as it is (a draft's nulls that the
    strict dialect asked for were read as left out when it was collected, rule 19)."""
    if not text.strip():
        return [Reason(ReasonCode.TOO_SHORT, EMPTY_EDIT)]
    checker = DraftChecker.of(prompt)
    text_field = prompt.rules.get("text_field")
    if checker.validator is None or not text_field:
        checked = checker.check(text)
        return checked.reasons + checker.unstated(checked.claimed, checked.text, source_text(revision))
    try:
        answer = read_draft(version.answer)[0]
    except (ValueError, RecursionError):
        answer = None
    data = {**answer, text_field: text} if isinstance(answer, dict) else {text_field: text}
    errors = [e for e in checker.schema_errors(data) if list(e.absolute_path)[:1] == [text_field]]
    if errors:
        return [schema_reason(jsonschema.exceptions.best_match(errors))]
    # The length rules and the claims, on the text itself (an empty schema checks nothing more).
    rules = DraftChecker({}, prompt.rules)
    checked = rules.check(text)
    return checked.reasons + rules.unstated(checked.claimed, checked.text, source_text(revision))


def approve_version(
    *, item_id: int, version_id: int, version_hash: str, approver, content: str | None = None, note: str = ""
) -> Approval:
    """Approve one specific version (id + content hash). Applying is queued, never awaited.

    `content` is the reviewer's edited final text (None: the draft as it is). It is judged like a
    draft and refused with its reasons when it fails; an empty one is refused. A valid edit may also
    repair an unusable draft: an item in `validation_failed` becomes `approved` with it."""
    with transaction.atomic():
        item = (
            Item.objects.select_for_update(of=("self",))  # the item's row only, not its job's
            .select_related("job__prompt_version", "source_revision")
            .get(pk=item_id)
        )
        repairing = item.state == ItemState.VALIDATION_FAILED
        if repairing and content is None:
            raise NotAllowed(INVALID_DRAFT)
        if item.state not in DECIDABLE_STATES:
            raise NotAllowed(
                f"This draft cannot be approved: the item is now “{ItemState(item.state).label}”"
            )
        claims.check_not_held(item.pk, approver)
        version = item.versions.filter(pk=version_id).first()
        if version is None:
            raise NotAllowed("That version does not belong to this item")
        if version.content_hash != version_hash:
            raise NotAllowed("The draft changed since it was shown; reload and review it again")
        if item.versions.filter(number__gt=version.number).exists():
            raise NotAllowed("A newer draft exists for this item; review that one")
        if content is not None:
            reasons = edit_reasons(
                prompt=item.job.prompt_version, revision=item.source_revision, version=version, text=content
            )
            if reasons:
                raise EditRefused(reasons)
        elif not version.valid:
            raise NotAllowed(INVALID_DRAFT)
        problem = currency_problem(item)
        if problem is None:
            final = version.content if content is None else content
            approval = Approval.objects.create(
                item=item,
                version=version,
                version_hash=version.content_hash,
                approved_by=approver,
                final_content=final,
                edited=final != version.content,
                note=note,
            )
            data = {"version": version.pk, "content_hash": version.content_hash, "edited": approval.edited}
            if repairing:
                # What made the draft unusable: an undo gives it back (`undo_decision`).
                data["repaired"] = True
                data["unusable"] = {"reason": item.reason, "code": item.reason_code}
            # Held for the undo window: the collector's pass applies it once the window has passed.
            hold = settings.BATCHDESK_UNDO_SECONDS
            change_state(
                item.pk,
                to=ItemState.APPROVED,
                actor=approver,
                reason=REPAIRED if repairing else "",
                expect=DECIDABLE_STATES,
                data=data,
                approved_version=version,
                next_attempt_at=timezone.now() + timedelta(seconds=hold) if hold else None,
            )
            claims.decided(item.pk)
            if not hold:
                enqueue("ledger.tasks.apply_item", item.pk)
    if problem is not None:
        # Moved out of the way in its own transaction, so the refusal's outcome is kept.
        judge_currency(item, actor=approver)
        refresh_job_state(item.job_id)
        raise NotAllowed(STOPS[problem].refusal)
    refresh_job_state(item.job_id)
    return approval


def reject_version(
    *, item_id: int, version_id: int, reviewer, reason: str = "", reason_code: str = ""
) -> Item:
    """Reject a draft, for a reason code from its prompt version's list, words of the reviewer's own,
    or both (SPEC §6: one of the two is required); with only a code, its label is the reason."""
    reason = reason.strip()
    if not reason and not reason_code:
        raise NotAllowed("Say why the draft is rejected: pick a reason or write one")
    with transaction.atomic():
        if not GeneratedVersion.objects.filter(pk=version_id, item_id=item_id).exists():
            raise NotAllowed("That version does not belong to this item")
        claims.check_not_held(item_id, reviewer)
        data = {"version": version_id}
        if reason_code:
            prompt = PromptVersion.objects.get(jobs__items=item_id)
            label = prompt.rejection_reason_label(reason_code)
            if label is None:
                raise ReasonCodeUnknown(reason_code, prompt)
            data["reason_code"] = reason_code
            reason = reason or label
        item = change_state(
            item_id,
            to=ItemState.REJECTED,
            actor=reviewer,
            reason=reason,
            code=ReasonCode.REJECTED_BY_REVIEWER,
            expect=[ItemState.AWAITING_REVIEW],
            data=data,
        )
        claims.decided(item_id)
    refresh_job_state(item.job_id)
    return item


class ReasonCodeUnknown(NotAllowed):
    """A rejection named a reason code its draft's prompt version does not have: bad input."""

    def __init__(self, code: str, prompt: PromptVersion):
        codes = ", ".join(r["code"] for r in prompt.rejection_reasons) or "none"
        super().__init__(f"{code!r} is not a rejection reason of prompt {prompt}; its reasons are: {codes}")


# --- undoing a decision ------------------------------------------------------------------------

DECISIONS = (ItemState.APPROVED, ItemState.REJECTED)


def last_decision(item: Item, actor) -> Event | None:
    """The person's last approval or rejection of the item, if they made one."""
    return (
        item.events.filter(to_state__in=DECISIONS, actor=actor).order_by("-id").first()
        if actor is not None and actor.is_authenticated
        else None
    )


def undo_refusal(item: Item, decision: Event | None, *, now=None) -> str:
    """Why this decision can no longer be undone, in words for its card; "" while it can."""
    window = settings.BATCHDESK_UNDO_SECONDS
    if decision is None:
        return "You have made no decision on this draft to undo"
    if not window:
        return "Decisions are not held for undoing here (BATCHDESK_UNDO_SECONDS is 0)"
    if item.state != decision.to_state or item.events.filter(pk__gt=decision.pk).exists():
        if item.state in (ItemState.APPLYING, ItemState.APPLIED):
            return "It can no longer be undone: applying it has started"
        return (
            f"It can no longer be undone: the item has moved on since (now “{ItemState(item.state).label}”)"
        )
    now = now or timezone.now()
    if now - decision.at > timedelta(seconds=window):
        return f"It can no longer be undone: the {window:g} seconds to undo it have passed"
    if decision.to_state == ItemState.APPROVED and (
        item.next_attempt_at is None or item.next_attempt_at <= now
    ):
        # The item's own hold is what the workers obey: past it, applying may be starting.
        return "It can no longer be undone: applying it is starting"
    return ""


def undo_decision(*, item_id: int, actor) -> Item:
    """Undo the person's last decision on an item within BATCHDESK_UNDO_SECONDS, while nothing was
    applied: the item waits for review again (an approval that repaired an unusable draft: unusable
    again), the approval is kept as undone, and the undo's event names the decision it undid."""
    with transaction.atomic():
        item = Item.objects.select_for_update(of=("self",)).get(pk=item_id)
        decision = last_decision(item, actor)
        if refusal := undo_refusal(item, decision):
            raise NotAllowed(refusal)
        version_id = decision.data.get("version")
        # The event that put the draft before the reviewer: its time is the draft's place in the
        # queue again, and an unusable draft's reason comes back with it.
        shown = item.events.filter(pk__lt=decision.pk, to_state=decision.from_state).order_by("-id").first()
        if decision.to_state == ItemState.APPROVED:
            Approval.objects.standing().filter(item=item, version_id=version_id).update(
                undone_at=timezone.now()
            )
        back_to = ItemState(decision.from_state)
        words = (
            f"{'Approval' if decision.to_state == ItemState.APPROVED else 'Rejection'} undone by its reviewer"
        )
        reason, code = words, ReasonCode.DECISION_UNDONE
        if back_to == ItemState.VALIDATION_FAILED:
            unusable = decision.data.get("unusable") or {}
            reason, code = unusable.get("reason", words), unusable.get("code", "")
        item = change_state(
            item.pk,
            to=back_to,
            actor=actor,
            reason=reason,
            code=code,
            expect=[decision.to_state],
            data={"undoes": decision.pk, "version": version_id, "decision": decision.to_state},
            approved_version=None,
            next_attempt_at=None,
        )
        if shown is not None:
            Item.objects.filter(pk=item.pk).update(updated_at=shown.at)
            item.updated_at = shown.at
    refresh_job_state(item.job_id)
    return item


# --- comments ----------------------------------------------------------------------------------

MAX_COMMENT_LENGTH = 4000


def add_comment(
    *, item_id: int, author, text: str, version_id: int | None = None, form_token: uuid.UUID | None = None
) -> Comment:
    """A comment on an item's draft for colleagues. The same form sent twice (its `form_token`) adds it
    once: the second send gets the first's comment."""
    text = text.strip()
    if not text:
        raise NotAllowed("Write the comment first")
    if len(text) > MAX_COMMENT_LENGTH:
        raise NotAllowed(f"A comment is at most {MAX_COMMENT_LENGTH} characters (this one has {len(text)})")
    if (
        version_id is not None
        and not GeneratedVersion.objects.filter(pk=version_id, item_id=item_id).exists()
    ):
        raise NotAllowed("That version does not belong to this item")
    if form_token is not None and (
        earlier := Comment.objects.filter(author=author, form_token=form_token).first()
    ):
        return earlier
    try:
        with transaction.atomic():
            return Comment.objects.create(
                item_id=item_id, version_id=version_id, author=author, text=text, form_token=form_token
            )
    except IntegrityError:  # the same form, sent twice at once: the other send wrote it
        earlier = Comment.objects.filter(author=author, form_token=form_token).first()
        if earlier is None:
            raise
        return earlier


# --- regenerating with another prompt version ------------------------------------------------

# Drafts that a new prompt version may be asked to write again: unusable, or rejected by a reviewer.
REGENERABLE_STATES = (ItemState.VALIDATION_FAILED, ItemState.REJECTED)


def regeneration_reference(item: Item, prompt_version: int) -> str:
    """The job that regenerates `item` with `prompt_version`: one per (item, version), so the same
    form sent twice finds the job it started (rule 15) rather than starting a second."""
    suffix = f"-item{item.pk}-prompt-v{prompt_version}"
    return item.job.reference[: Job._meta.get_field("reference").max_length - len(suffix)] + suffix


def regenerate_with_prompt(*, item_id: int, prompt_version: int, actor) -> tuple[Job, bool]:
    """Ask for a new draft of an unusable or rejected item with another prompt version.

    A job has one prompt version (SPEC §1), so the new draft is the work of a new one-item job over
    the product's current revision, with the same task, provider, model and destination; the item
    itself becomes `cancelled` (its draft kept as evidence) with an event naming that job. Returns
    (the job, whether it was started now): a job this item was already regenerated into with this
    version is returned as it is."""
    item = Item.objects.select_related("job", "product").get(pk=item_id)
    reference = regeneration_reference(item, prompt_version)
    started = Job.objects.filter(reference=reference).first()
    if started is not None:
        return regenerated_into(item, started), False
    if item.state not in REGENERABLE_STATES:
        raise NotAllowed(
            f"Only an unusable or rejected draft is regenerated; the item is now “{ItemState(item.state).label}”"
        )
    source = item.job
    if source.state == JobState.CANCELLED:
        raise NotAllowed("The job was cancelled; nothing of it is regenerated")
    if not PromptVersion.objects.filter(task=source.task, version=prompt_version).exists():
        raise NotAllowed(f"The task {source.task!r} has no prompt version {prompt_version}")
    try:
        job = start_regeneration(item, source, reference, prompt_version, actor)
    except IntegrityError:
        # The same form sent by two requests at once: the other one started the job.
        started = Job.objects.filter(reference=reference).first()
        if started is None:
            raise
        return regenerated_into(item, started), False
    refresh_job_state(source.pk)
    return job, True


def regenerated_into(item: Item, job: Job) -> Job:
    """`job`, found by the reference that regenerating `item` would give its job, if the item was
    regenerated into it (its event says so). A job that took the reference otherwise (started on the
    screen or through the API with that reference) is not this item's regeneration: refused, rather
    than shown as one while the item stays as it was."""
    if not item.events.filter(to_state=ItemState.CANCELLED, data__regenerated_in=job.pk).exists():
        raise NotAllowed(
            f"The reference {job.reference} that this regeneration's job would have is taken by another "
            "job, which did not regenerate this item; nothing was started"
        )
    return job


def start_regeneration(item: Item, source: Job, reference: str, prompt_version: int, actor) -> Job:
    """`regenerate_with_prompt`'s writes, in one transaction: the new job and the item cancelled."""
    with transaction.atomic():
        job = create_job(
            reference=reference,
            owner=actor,
            task=source.task,
            provider=source.provider,
            model=source.model,
            prompt_version=prompt_version,
            destination=source.destination,
            skus=[item.product.sku],
        )
        change_state(
            item.pk,
            to=ItemState.CANCELLED,
            actor=actor,
            reason=f"Regenerated with prompt version {prompt_version} in job {job.reference}",
            expect=REGENERABLE_STATES,
            data={"regenerated_in": job.pk, "prompt_version": prompt_version},
        )
    return job
