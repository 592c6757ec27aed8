"""Reviewing: approving one specific version, or rejecting a draft (rule 6)."""

from django.db import transaction

from ..models import Approval, GeneratedVersion, Item
from ..states import ItemState, ReasonCode
from .core import NotAllowed, change_state, enqueue, refresh_job_state
from .jobs import currency_problem, judge_currency


def approve_version(
    *, item_id: int, version_id: int, version_hash: str, approver, content: str | None = None, note: str = ""
) -> Approval:
    """Approve one specific version (id + content hash). Applying is queued, never awaited."""
    with transaction.atomic():
        item = Item.objects.select_for_update().get(pk=item_id)
        if item.state != ItemState.AWAITING_REVIEW:
            raise NotAllowed(
                f"This draft cannot be approved: the item is {ItemState(item.state).label.lower()}"
            )
        version = item.versions.filter(pk=version_id).first()
        if version is None:
            raise NotAllowed("That version does not belong to this item")
        if version.content_hash != version_hash:
            raise NotAllowed("The draft changed since it was shown; reload and review it again")
        if not version.valid:
            raise NotAllowed("Only a valid draft can be approved")
        if item.versions.filter(number__gt=version.number).exists():
            raise NotAllowed("A newer draft exists for this item; review that one")
        problem = currency_problem(item)
        if problem is None:
            final = content if content is not None and content.strip() else version.content
            approval = Approval.objects.create(
                item=item,
                version=version,
                version_hash=version.content_hash,
                approved_by=approver,
                final_content=final,
                edited=final != version.content,
                note=note,
            )
            change_state(
                item.pk,
                to=ItemState.APPROVED,
                actor=approver,
                expect=[ItemState.AWAITING_REVIEW],
                data={"version": version.pk, "content_hash": version.content_hash, "edited": approval.edited},
                approved_version=version,
            )
            enqueue("ledger.tasks.apply_item", item.pk)
    if problem is not None:
        # Moved out of the way in its own transaction, so the refusal's outcome is kept.
        judge_currency(item, actor=approver)
        refresh_job_state(item.job_id)
        raise NotAllowed(APPROVAL_REFUSALS[problem])
    refresh_job_state(item.job_id)
    return approval


APPROVAL_REFUSALS = {
    ItemState.WITHDRAWN: "The product was withdrawn; nothing will be published for it",
    ItemState.OBSOLETE: "The product changed since this draft was generated; a new draft has been requested",
}


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
