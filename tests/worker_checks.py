"""What the tests with real worker processes check for every provider, read from the ledger and
from the emulator's own evidence (`/_emulator/stats`), each provider by its capabilities."""

from django.utils import timezone

from ledger.actions.core import NotAllowed
from ledger.actions.submitting import resend_uncertain
from ledger.models import CollectorHeartbeat, Item, Submission
from ledger.providers.base import Delivery, Finding
from ledger.states import ItemState, SubmissionState
from tests.processes import wait_until


def units_at_provider(stats: dict, provider) -> int | None:
    """How many units the provider holds, whatever its protocol calls them (OpenAI, Anthropic and
    Gemini batches; Cloudflare queued requests, `units`). None: a synchronous server holds none."""
    if provider.capabilities.delivery == Delivery.PER_REQUEST:
        assert "batches" not in stats and "units" not in stats
        return None
    return stats["batches"] if "batches" in stats else stats["units"]


def waited_for_an_operator(submission: Submission, grace: float) -> bool:
    """The collector has polled since the grace period (the workers' own) of this uncertain
    submission ran out, and left it and its items as they were: it waits for an operator."""
    submission.refresh_from_db()
    if submission.state != SubmissionState.UNCERTAIN:
        return False
    since = (timezone.now() - submission.updated_at).total_seconds()
    polled = (
        CollectorHeartbeat.objects.filter(name="collector").values_list("last_poll_at", flat=True).first()
    )
    if since < grace or polled is None or (polled - submission.updated_at).total_seconds() < grace + 1:
        return False
    assert submission.provider_ref == ""
    assert set(Item.objects.filter(submission=submission).values_list("state", flat=True)) == {
        ItemState.SUBMISSION_UNCERTAIN
    }
    return True


def settle(job, processes, *, done, provider, operator, timeout: float, what: str) -> list[int]:
    """Wait until `done()`. A provider that cannot be searched (`Finding.NOT_AT_ALL`) leaves a
    submission whose create answer was lost waiting for an operator: once it has visibly waited,
    the operator sends it again, accepting the risk of paying twice. Returns those submissions."""
    resent: list[int] = []
    grace = float(processes.env["BATCHDESK_UNCERTAIN_GRACE_SECONDS"])

    def settled():
        if done():
            return True
        if provider.capabilities.finding == Finding.NOT_AT_ALL:
            for submission in Submission.objects.filter(job=job, state=SubmissionState.UNCERTAIN):
                if waited_for_an_operator(submission, grace):
                    try:
                        resend_uncertain(submission.pk, actor=operator)
                    except NotAllowed:
                        continue  # a worker is looking at it this very moment: next time
                    resent.append(submission.pk)
        return False

    try:
        wait_until(settled, timeout=timeout, what=what, every=0.25)
    except AssertionError as exc:
        submissions = Submission.objects.filter(job=job).values_list("pk", "state", "provider_ref", "error")
        raise AssertionError(
            f"{exc}: items {job.items.counts_by_state()}, submissions {list(submissions)}, resent {resent}"
        ) from None
    return resent
