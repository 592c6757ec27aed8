"""Provider-side clean-up (SPEC §11): once a unit's results are recorded, its files at the provider
(input, output, errors) are deleted where the provider lets them be (OpenAI, Gemini), so they stop
filling its storage quota, unless `BATCHDESK_KEEP_PROVIDER_FILES=1`.

A collected unit is marked `files_to_delete` in the transaction that collects it; a worker task
queued on commit deletes them, and the collector's pass queues it again for any unit still marked
(a lost task, a provider that failed: tried again a while later). Never part of collection: a
provider that will not delete slows nothing. Each deletion is an event on the unit."""

import logging
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ..models import Event, Submission, lease_end
from ..pilots.drill import repeated_deliveries_due
from ..providers import capabilities, get_provider
from ..providers.base import ProviderError
from ..states import SubmissionState

log = logging.getLogger(__name__)

# A provider that failed to delete a unit's files is asked again after this long.
RETRY_AFTER = timedelta(minutes=10)
# Units whose files one pass queues for deletion at most; the rest wait for the next.
MOST_PER_PASS = 200


def on_entering(submission: Submission, to: str, fields: dict) -> dict:
    """What a submission entering state `to` (with these `fields`) records: once collected, whether
    its files are to go."""
    if to != SubmissionState.COLLECTED or settings.BATCHDESK_KEEP_PROVIDER_FILES:
        return {}
    return {"files_to_delete": True} if capabilities(submission.provider).deletes_files else {}


def claim_due() -> list[tuple[int, str]]:
    """Collected units whose files wait to be deleted, claimed for their tasks under one token in
    one statement (as the pass claims the units it polls): [(id, claim)]."""
    if settings.BATCHDESK_KEEP_PROVIDER_FILES:
        return []
    now = timezone.now()
    token = uuid.uuid4().hex
    with transaction.atomic():
        waiting = list(
            Submission.objects.select_for_update(skip_locked=True)
            .filter(files_to_delete=True, state=SubmissionState.COLLECTED)
            .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
            # A pilot's drill will read these results once more: left to it, and deleted after.
            .exclude(pk__in=repeated_deliveries_due())
            .order_by("pk")
            .values_list("pk", flat=True)[:MOST_PER_PASS]
        )
        Submission.objects.filter(pk__in=waiting).update(claimed_until=lease_end(), claimed_by=token)
    return [(submission_id, token) for submission_id in waiting]


def delete_provider_files(submission_id: int, *, held: str = "", provider=None) -> str:
    """Delete a collected unit's files at its provider and record it as an event; safe to run twice."""
    if settings.BATCHDESK_KEEP_PROVIDER_FILES:
        return "kept (BATCHDESK_KEEP_PROVIDER_FILES)"
    claim = Submission.objects.claim(submission_id, states=[SubmissionState.COLLECTED], held=held)
    if not claim:
        return "not claimable"
    submission = Submission.objects.get(pk=submission_id)
    if not submission.files_to_delete:
        Submission.objects.filter(pk=submission_id, claimed_by=claim).update(claimed_until=None)
        return "nothing to delete"
    if submission_id in repeated_deliveries_due():
        # A pilot's drill will read these results once more: deleted after it has.
        Submission.objects.filter(pk=submission_id, claimed_by=claim).update(claimed_until=None)
        return "kept until the drill has delivered them again"
    provider = provider or get_provider(submission.provider)
    try:
        gone = provider.delete_files(submission.provider_ref)
    except ProviderError as exc:
        log.warning("The files of unit %s could not be deleted at the provider: %s", submission_id, exc)
        Submission.objects.filter(pk=submission_id, claimed_by=claim).update(
            claimed_until=timezone.now() + RETRY_AFTER
        )
        return "failed; tried again later"
    now = timezone.now()
    with transaction.atomic():
        done = Submission.objects.filter(pk=submission_id, claimed_by=claim, files_to_delete=True).update(
            files_to_delete=False, files_deleted_at=now, claimed_until=None
        )
        if done:
            Event.objects.note_on_unit(
                submission,
                reason=f"Its files were deleted at the provider: {', '.join(gone) or 'none were left'}",
                data={"provider_files_deleted": gone},
            )
    return "deleted"
