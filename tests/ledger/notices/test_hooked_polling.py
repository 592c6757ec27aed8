"""Polling stays the fallback once a provider's batch webhooks arrive (issue 20 point 5): an open unit
of a provider whose webhook secret is set is polled at most every BATCHDESK_HOOKED_POLL_SECONDS,
unless a webhook about it came since it was last observed; the collector's passes, and the stalled
check that watches them, go on as before. A webhook that finds the unit held by its poll is not left
to the next pass: the poll asks again (issue 29 point 3)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger import tasks
from ledger.actions import collecting
from ledger.health import collector_stalled
from ledger.models import CollectorHeartbeat, HintOutcome, Job, ProviderHint, Submission
from ledger.providers import get_provider
from ledger.providers.openai import OpenAIBatchProvider
from ledger.states import JobState, SubmissionState
from tests.api.test_provider_hooks import gemini_unit, hooked, openai_event, openai_unit, post  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db


def observed(unit: Submission, ago: timedelta) -> None:
    Submission.objects.filter(pk=unit.pk).update(last_observed_at=timezone.now() - ago, claimed_until=None)


def claimed_by_a_pass(unit: Submission) -> bool:
    _, due = tasks.claim_due_submissions(timezone.now())
    Submission.objects.filter(pk=unit.pk).update(claimed_until=None)
    return unit.pk in [pk for pk, _ in due]


def test_a_hooked_unit_observed_lately_waits_for_its_webhook(openai_unit, settings):  # noqa: F811
    emulator, clock, job, unit = openai_unit
    settings.BATCHDESK_HOOKED_POLL_SECONDS = 300

    observed(unit, timedelta(seconds=40))
    assert not claimed_by_a_pass(unit)
    observed(unit, timedelta(seconds=301))
    assert claimed_by_a_pass(unit)
    Submission.objects.filter(pk=unit.pk).update(last_observed_at=None)
    assert claimed_by_a_pass(unit)


def test_without_its_secret_a_unit_is_polled_every_pass(openai_unit, monkeypatch):  # noqa: F811
    emulator, clock, job, unit = openai_unit
    monkeypatch.delenv("OPENAI_WEBHOOK_SECRET")
    observed(unit, timedelta(seconds=40))
    assert claimed_by_a_pass(unit)


def test_another_providers_secret_does_not_slow_this_ones_polls(gemini_unit, monkeypatch):  # noqa: F811
    emulator, clock, job, unit = gemini_unit
    monkeypatch.delenv("GEMINI_WEBHOOK_SECRET")  # only OpenAI's webhooks arrive
    observed(unit, timedelta(seconds=40))
    assert claimed_by_a_pass(unit)


def test_a_webhook_newer_than_the_last_observation_is_polled_by_the_next_pass(openai_unit):  # noqa: F811
    """The webhook found the unit held by a poll that may have asked just before the batch ended."""
    emulator, clock, job, unit = openai_unit
    observed(unit, timedelta(seconds=40))
    ProviderHint.objects.create(
        provider="openai",
        webhook_id="wh_1",
        batch_ref=unit.provider_ref,
        submission=unit,
        outcome=HintOutcome.POLL_UNDER_WAY,
        received_at=timezone.now() - timedelta(seconds=50),
    )
    assert not claimed_by_a_pass(unit)  # that webhook was seen by the last observation
    ProviderHint.objects.create(
        provider="openai",
        webhook_id="wh_2",
        batch_ref=unit.provider_ref,
        submission=unit,
        outcome=HintOutcome.POLL_UNDER_WAY,
        received_at=timezone.now() - timedelta(seconds=30),
    )
    assert claimed_by_a_pass(unit)


def test_a_cancelled_jobs_unit_still_to_be_stopped_is_asked_every_pass(openai_unit):  # noqa: F811
    emulator, clock, job, unit = openai_unit
    Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)
    observed(unit, timedelta(seconds=40))
    assert claimed_by_a_pass(unit)


def test_the_stalled_check_watches_the_passes_not_the_hooked_units_polls(openai_unit, settings):  # noqa: F811
    emulator, clock, job, unit = openai_unit
    settings.BATCHDESK_POLL_SECONDS = 30
    settings.BATCHDESK_HOOKED_POLL_SECONDS = 3600
    # The unit was last asked about 50 minutes ago, as it should be; the passes go on.
    observed(unit, timedelta(minutes=50))
    tasks.poll_everything(start=lambda *args: None)
    assert not collector_stalled()
    # The passes stop: stalled after three poll intervals, however long a hooked unit may wait.
    CollectorHeartbeat.objects.filter(name="collector").update(
        last_poll_at=timezone.now() - timedelta(seconds=91)
    )
    assert collector_stalled()


def test_a_webhook_that_came_while_the_unit_was_asked_has_it_asked_again_at_once(
    client,
    openai_unit,  # noqa: F811
    monkeypatch,
):
    """The provider answered that the batch was running just before it ended, and its webhook came while
    that answer was on its way: the unit was held by the poll, so the webhook only noted itself. The
    poll asks again once it has let the unit go and collects it, instead of leaving it to the
    collector's next pass."""
    emulator, clock, job, unit = openai_unit
    answer = OpenAIBatchProvider.status

    def answered_then_ended(provider, ref):
        said = answer(provider, ref)
        if not ProviderHint.objects.exists():
            clock.advance(seconds=5)  # the batch ends at the provider, which posts its webhook
            post(client, "/hooks/openai", openai_event(ref))
        return said

    monkeypatch.setattr(OpenAIBatchProvider, "status", answered_then_ended)
    held = Submission.objects.claim(unit.pk, states=[SubmissionState.OPEN])

    assert tasks.poll_submission(unit.pk, held) == "collected"
    assert ProviderHint.objects.get().outcome == HintOutcome.POLL_UNDER_WAY
    assert Submission.objects.get(pk=unit.pk).state == SubmissionState.COLLECTED


def test_a_webhook_older_than_the_question_has_the_unit_asked_once(
    client,
    openai_unit,  # noqa: F811
    monkeypatch,
    django_capture_on_commit_callbacks,
):
    """The usual order: the webhook claims the unit and queues its poll, which asks once (the batch
    has not ended here: the emulator's clock stands still) and lets the unit go."""
    emulator, clock, job, unit = openai_unit
    asked = []
    answer = OpenAIBatchProvider.status
    monkeypatch.setattr(
        OpenAIBatchProvider, "status", lambda provider, ref: asked.append(ref) or answer(provider, ref)
    )
    with django_capture_on_commit_callbacks(execute=False):
        post(client, "/hooks/openai", openai_event(unit.provider_ref))
    held = Submission.objects.get(pk=unit.pk).claimed_by

    assert tasks.poll_submission(unit.pk, held) == "validating"  # the clock stands still
    assert asked == [unit.provider_ref]
    assert Submission.objects.get(pk=unit.pk).claimed_until is None


def test_a_webhook_that_came_while_the_answer_travelled_is_newer_than_the_observation(
    openai_unit,  # noqa: F811
    monkeypatch,
):
    """What the provider says is as of when it was asked: a webhook noted while its answer was on its
    way (its poll's worker stopping, say) has the next pass poll the unit, not one
    BATCHDESK_HOOKED_POLL_SECONDS later."""
    emulator, clock, job, unit = openai_unit
    answer = OpenAIBatchProvider.status

    def answered_then_hinted(provider, ref):
        said = answer(provider, ref)
        ProviderHint.objects.create(
            provider="openai",
            webhook_id="wh_1",
            batch_ref=ref,
            submission=unit,
            outcome=HintOutcome.POLL_UNDER_WAY,
        )
        return said

    monkeypatch.setattr(OpenAIBatchProvider, "status", answered_then_hinted)

    assert collecting.observe_submission(unit.pk, provider=get_provider("openai")) == "validating"
    assert claimed_by_a_pass(unit)
