"""What operators do: retry the smallest failed unit, re-drive dead letters, cancel jobs (and
their batches at the provider)."""

from django.db import transaction
from django.utils import timezone

from ..drafts.scrubbing import stored_text
from ..models import Event, Item, Job, Submission
from ..providers import get_provider
from ..providers.base import ProviderError
from ..states import STOPS, ItemState, JobState, ReasonCode, SubmissionState, sources_for
from .collecting import retry_inference
from .core import NotAllowed, actor_name, change_state, enqueue, move_items
from .job_states import change_job_state, refresh_job_state
from .jobs import currency_problem


def retry_item(item_id: int, *, unit: str, actor=None) -> Item:
    """An operator retries the smallest failed unit of one item: its inference or its application."""
    item = Item.objects.select_related("job").get(pk=item_id)
    if unit not in ("inference", "destination"):
        raise NotAllowed(f"Unknown unit {unit!r}: use inference or destination")
    if item.job.state == JobState.CANCELLED:
        raise NotAllowed("The job was cancelled; nothing of it is retried any more")
    if unit == "inference":
        if item.state == ItemState.DEAD_LETTER and item.approved_version_id:
            raise NotAllowed("This item failed while being applied; retry its destination instead")
        retried = retry_inference(item_id, actor=actor, reason="Retried by an operator", inference_failures=0)
        refresh_job_state(item.job_id)
        return retried
    if unit == "destination":
        if not item.approved_version_id:
            raise NotAllowed("Nothing was approved for this item, so there is nothing to apply")
        if problem := currency_problem(item):
            raise NotAllowed(STOPS[problem].retry_refusal)
        with transaction.atomic():
            changed = change_state(
                item_id,
                to=ItemState.APPLYING,
                actor=actor,
                reason="Application retried by an operator (same approved draft, same operation key)",
                expect=[ItemState.DESTINATION_REJECTED, ItemState.DEAD_LETTER],
                apply_failures=0,
                next_attempt_at=None,
            )
            enqueue("ledger.tasks.apply_item", item_id)
        return changed


def redrive_dead_letter(item_id: int, *, actor=None) -> Item:
    """Send a dead letter back to where it gave up: applying if a version was approved, else the model."""
    item = Item.objects.get(pk=item_id)
    if item.state != ItemState.DEAD_LETTER:
        raise NotAllowed("Only dead letters can be re-driven")
    return retry_item(item_id, unit="destination" if item.approved_version_id else "inference", actor=actor)


# Everything not used yet: waiting for the model, a reviewer, an operator or the destination. An
# item being applied is not: its attempt may be landing right now, so it finishes.
CANCELLABLE_ITEM_STATES = sorted(sources_for(ItemState.CANCELLED))


def cancellable_items(job: Job):
    """The items `cancel_job` cancels: everything of the job not used yet."""
    return job.items.filter(state__in=CANCELLABLE_ITEM_STATES)


def cancel_job(*, job_id: int, actor=None) -> dict:
    """Cancel what has not been used yet: every item not applied or being applied is cancelled, the
    job is marked cancelled so nothing more of it is sent, and each of its batches still running at
    the provider is asked to stop (the provider's answer is recorded on the submission). Raises
    NotAllowed when the job is already cancelled."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state == JobState.CANCELLED:
            raise NotAllowed("The job is cancelled already; there is nothing left to cancel")
        # Locked first, so none of them moves on between being read and being cancelled.
        waiting = list(cancellable_items(job).select_for_update().order_by("id").values_list("pk", "state"))
        if job.state == JobState.COMPLETED and not waiting:
            raise NotAllowed("The job is completed; there is nothing left to cancel")
        reason = f"Job cancelled by {actor_name(actor)}"
        cancelled: list[int] = []
        for state in CANCELLABLE_ITEM_STATES:
            ids = [pk for pk, item_state in waiting if item_state == state]
            if ids:
                cancelled += move_items(
                    ids,
                    from_state=state,
                    to=ItemState.CANCELLED,
                    reason=reason,
                    code=ReasonCode.JOB_CANCELLED,
                    actor=actor,
                    next_attempt_at=None,
                )
        running = list(job.submissions.filter(state=SubmissionState.OPEN).values_list("pk", flat=True))
        from_state = job.state
        change_job_state(
            job,
            to=JobState.CANCELLED,
            actor=actor,
            reason=reason,
            data={"items_cancelled": len(cancelled), "batches_to_stop": len(running)},
        )
        for submission_id in running:
            enqueue("ledger.tasks.cancel_at_provider", submission_id)
    return {
        "job": job.pk,
        "from_state": from_state,
        "state": JobState.CANCELLED.value,
        "items_cancelled": len(cancelled),
        "batches_to_stop": len(running),
    }


def cancel_at_provider(submission_id: int, *, provider=None) -> str:
    """Ask the provider to stop a batch of a cancelled job, once, and record what it said. The batch
    stays `open`: its end, and whatever it produced before stopping, is still polled and collected.
    A provider that cannot be reached is asked again by the next collector round."""
    submission = Submission.objects.select_related("job").get(pk=submission_id)
    if (
        submission.state != SubmissionState.OPEN
        or submission.job.state != JobState.CANCELLED
        or submission.cancel_answered_at is not None
    ):
        return "nothing to stop"
    provider = provider or get_provider(submission.provider)
    answer, said = ask_to_cancel(provider, submission.provider_ref)
    if answer is None:
        Submission.objects.filter(pk=submission_id).update(error=stored_text(said))
        return "retry later"
    with transaction.atomic():
        recorded = Submission.objects.filter(pk=submission_id, cancel_answered_at__isnull=True).update(
            cancel_answered_at=timezone.now(),
            **({"last_observed_status": answer, "last_observed_at": timezone.now()} if answer else {}),
        )
        if recorded:
            Event.objects.note_on_unit(submission, reason=stored_text(said), data={"provider_answer": answer})
    return said


def ask_to_cancel(provider, provider_ref: str) -> tuple[str | None, str]:
    """The provider's answer (None: it could not be reached, ask again later) and what to record."""
    if not provider.capabilities.can_cancel:
        return (
            "",
            "The provider cannot cancel a batch: it runs to its end, and its results are kept as evidence only",
        )
    try:
        answer = provider.cancel(provider_ref)
    except ProviderError as exc:
        if exc.transient:
            return None, str(exc)
        # A permanent refusal (say, the batch had finished already) is an answer too.
        return "", f"The provider refused to cancel it: {exc}"
    return answer, f"Asked to cancel; the provider says {answer or 'nothing'}"
