"""A create call that never left this machine (no connection) leaves nothing at the provider to
look for: the intent is simply sent again later, even where the provider cannot be searched."""

import pytest

from ledger.actions.submitting import plan_submissions, send_submission
from ledger.models import Item, Submission
from ledger.states import ItemState, SubmissionState
from tests.factories import JobFactory, ProductFactory
from tests.processes import free_port
from tests.provider_emulators import BY_NAME, serving

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("name", ["cloudflare", "anthropic", "openai"])
def test_a_provider_that_could_not_be_reached_is_asked_again_without_reconciling(settings, monkeypatch, name):
    provider = BY_NAME[name]
    with serving(provider, settings, monkeypatch) as emulator:
        job = JobFactory(provider=provider.name, model=provider.model, unit_size=5)
        for _ in range(3):
            product = ProductFactory()
            Item.objects.create(job=job, product=product, source_revision=product.current_revision)
        [submission_id] = plan_submissions(job.pk)
        reachable = settings.PROVIDERS[name]["base_url"]
        settings.PROVIDERS = {
            **settings.PROVIDERS,
            name: {**settings.PROVIDERS[name], "base_url": f"http://127.0.0.1:{free_port()}/nowhere"},
        }

        assert send_submission(submission_id) == "retry later"
        submission = Submission.objects.get(pk=submission_id)
        assert (submission.state, submission.sent_at) == (SubmissionState.INTENT, None)
        assert "could not be sent" in submission.error

        settings.PROVIDERS = {**settings.PROVIDERS, name: {**settings.PROVIDERS[name], "base_url": reachable}}
        Submission.objects.filter(pk=submission_id).update(claimed_until=None)
        assert send_submission(submission_id) == "sent"

        assert set(job.items.values_list("state", flat=True)) == {ItemState.SUBMITTED}
        assert emulator.stats()["creates"] == 1
