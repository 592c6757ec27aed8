"""Cancelling a job. A verb like those in `actions.py`, where it belongs; kept apart for now."""

from django.db import transaction
from django.utils import timezone

from .actions import NotAllowed, actor_name, move_items
from .models import Event, Job
from .states import ItemState, JobState, sources_for

# Items whose request has not produced a result yet: prepared, submitted, submission_uncertain.
CANCELLABLE_ITEM_STATES = sorted(sources_for(ItemState.CANCELLED))
OVER = (JobState.COMPLETED, JobState.CANCELLED)


def cancel_job(*, job_id: int, actor=None) -> dict:
    """Cancel what has not been used yet: every item still waiting for the model is cancelled, and
    the job is marked cancelled so nothing more of it is sent. Drafts that already came back are
    kept for review and may still be decided on. Raises NotAllowed when the job is already over."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        if job.state in OVER:
            raise NotAllowed(f"The job is {job.state}; there is nothing left to cancel")
        # Locked first, so none of them moves on between being read and being cancelled.
        waiting = list(
            job.items.select_for_update()
            .filter(state__in=CANCELLABLE_ITEM_STATES)
            .order_by("id")
            .values_list("pk", "state")
        )
        reason = f"Job cancelled by {actor_name(actor)}"
        cancelled: list[int] = []
        for state in CANCELLABLE_ITEM_STATES:
            ids = [pk for pk, item_state in waiting if item_state == state]
            if ids:
                cancelled += move_items(
                    ids, from_state=state, to=ItemState.CANCELLED, reason=reason, next_attempt_at=None
                )
        Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED, updated_at=timezone.now())
        Event.objects.create(
            job=job,
            from_state=job.state,
            to_state=JobState.CANCELLED,
            actor=actor,
            actor_name=actor_name(actor),
            reason=reason,
            data={"items_cancelled": len(cancelled)},
        )
    return {
        "job": job.pk,
        "from_state": job.state,
        "state": JobState.CANCELLED.value,
        "items_cancelled": len(cancelled),
    }
