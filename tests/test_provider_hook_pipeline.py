"""A provider's batch webhook wakes the collector (issue 20 point 5), through real processes: OpenAI's
emulator started as `run_emulator` posting its signed `batch.completed` to BatchDesk's
`/hooks/openai` (the live server), a django-q2 worker cluster whose fallback poll of hooked units
is an hour away, and PostgreSQL. The unit is collected long before its next poll because the
webhook arrived; each webhook, delivered twice, is acted on once."""

import pytest
from django_q.tasks import async_task

from ledger.actions.jobs import create_job
from ledger.models import HintOutcome, ProviderHint, Submission
from ledger.states import ItemState, SubmissionState
from tests.factories import UserFactory
from tests.processes import emulator_stats, make_catalogue, wait_until
from tests.provider_emulators import BY_NAME

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
HOOKED_POLL_SECONDS = 3600


def test_a_unit_is_collected_before_its_next_poll_because_its_webhook_arrived(
    processes, live_server, monkeypatch
):
    monkeypatch.setenv("OPENAI_WEBHOOK_SECRET", SECRET)  # the live server runs in this process
    emulator_url = processes.emulator(
        # Four requests of 2 s each: the batch is still running when the collector first asks.
        *("--per-request-ms", "2000"),
        *("--webhook-url", f"{live_server.url}/hooks/openai", "--webhook-secret", SECRET),
        *("--webhook-deliveries", "2"),
        provider=BY_NAME["openai"],
    )
    owner = UserFactory(roles=["catalogue_owner"])
    make_catalogue(4)
    processes.start(
        "qcluster", OPENAI_WEBHOOK_SECRET=SECRET, BATCHDESK_HOOKED_POLL_SECONDS=str(HOOKED_POLL_SECONDS)
    )
    job = create_job(
        reference="hooked",
        owner=owner,
        task="product_description",
        provider="openai",
        model="gpt-4o-mini",
        unit_size=10,
    )
    async_task("ledger.tasks.collect_round")

    unit = wait_until(
        lambda: Submission.objects.filter(job=job, last_observed_at__isnull=False).first(),
        timeout=120,
        what="the unit's first poll",
    )
    # Asked once while the batch ran; its next poll is an hour away.
    assert unit.state == SubmissionState.OPEN
    assert unit.last_observed_status in ("validating", "in_progress")

    wait_until(
        lambda: Submission.objects.get(pk=unit.pk).state == SubmissionState.COLLECTED,
        timeout=120,
        what="the unit to be collected",
    )
    assert set(job.items.counts_by_state()) <= {ItemState.AWAITING_REVIEW, ItemState.VALIDATION_FAILED}
    # It was the webhook: the one that came for this unit claimed it and queued its poll.
    (hint,) = ProviderHint.objects.filter(submission=unit)
    assert (hint.event_type, hint.outcome) == ("batch.completed", HintOutcome.POLL_QUEUED)
    # The emulator delivered it twice, both taken (2xx), with one webhook-id: acted on once.
    delivered = [
        sent for sent in emulator_stats(emulator_url)["webhooks"] if sent["unit"] == unit.provider_ref
    ]
    assert [sent["id"] for sent in delivered] == [hint.webhook_id] * 2
    assert all(sent["answers"] == [200] for sent in delivered)
