"""Reviewing: approving one specific version, with the reviewer's edits judged like a draft, or
rejecting a draft (rules 6 and 15)."""

import jsonschema
from django.db import IntegrityError, transaction

from ..drafts.reasons import Reason, schema_reason
from ..drafts.validation import DraftChecker, read_draft, source_text
from ..models import Approval, GeneratedVersion, Item, Job, PromptVersion, SourceRevision
from ..states import DECIDABLE_STATES, STOPS, ItemState, JobState, ReasonCode
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
                data["repaired"] = True
            change_state(
                item.pk,
                to=ItemState.APPROVED,
                actor=approver,
                reason=REPAIRED if repairing else "",
                expect=DECIDABLE_STATES,
                data=data,
                approved_version=version,
            )
            enqueue("ledger.tasks.apply_item", item.pk)
    if problem is not None:
        # Moved out of the way in its own transaction, so the refusal's outcome is kept.
        judge_currency(item, actor=approver)
        refresh_job_state(item.job_id)
        raise NotAllowed(STOPS[problem].refusal)
    refresh_job_state(item.job_id)
    return approval


def reject_version(*, item_id: int, version_id: int, reviewer, reason: str) -> Item:
    if not reason.strip():
        raise NotAllowed("Say why the draft is rejected")
    with transaction.atomic():
        if not GeneratedVersion.objects.filter(pk=version_id, item_id=item_id).exists():
            raise NotAllowed("That version does not belong to this item")
        item = change_state(
            item_id,
            to=ItemState.REJECTED,
            actor=reviewer,
            reason=reason.strip(),
            code=ReasonCode.REJECTED_BY_REVIEWER,
            expect=[ItemState.AWAITING_REVIEW],
            data={"version": version_id},
        )
    refresh_job_state(item.job_id)
    return item


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
