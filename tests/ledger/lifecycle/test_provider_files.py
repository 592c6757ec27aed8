"""Provider-side clean-up (SPEC §11, issue 20 point 3): once a unit's results are recorded, its
input and result files are deleted at the provider where it allows it (OpenAI, Gemini), by the
collector's pass, as an event on the unit; `BATCHDESK_KEEP_PROVIDER_FILES=1` keeps them. Checked at
the emulators (their own listing) and with the providers' official SDKs."""

from datetime import timedelta

import httpx
import openai
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from ledger.actions.collecting import poll_submission
from ledger.actions.submitting import plan_submissions, send_submission
from ledger.emulators.clock import TestClock
from ledger.lifecycle import provider_files
from ledger.models import Event, Submission
from ledger.providers import get_provider
from ledger.states import ItemState, SubmissionState
from tests.collector import poll_everything
from tests.factories import JobFactory, ProductFactory
from tests.provider_emulators import BY_NAME, serving

pytestmark = pytest.mark.django_db

DELETING = [BY_NAME[name] for name in ("emulator", "gemini")]


@pytest.fixture
def clock():
    return TestClock()


@pytest.fixture
def emulator(request, settings, monkeypatch, clock):
    """The emulator of the provider under test, on the test's clock; Gemini units go in files."""
    under_test = request.node.callspec.params["provider"]
    settings.BATCHDESK_RETRY_BASE_SECONDS = 0
    if under_test.name == "gemini":
        settings.PROVIDERS = {
            **settings.PROVIDERS,
            "gemini": {**settings.PROVIDERS["gemini"], "inline_max_requests": 1},
        }
    with serving(under_test, settings, monkeypatch, seed=5, clock=clock) as running:
        yield running


def collected_job(provider, clock, n: int = 3):
    """A job of `n` items whose one unit is sent, seen to end and collected, as the collector's
    tasks do; the pass that would then delete its files has not come round yet."""
    job = JobFactory(provider=provider.name, model=provider.model, unit_size=n)
    for _ in range(n):
        product = ProductFactory()
        job.items.create(product=product, source_revision=product.current_revision)
    [submission_id] = plan_submissions(job.pk)
    assert send_submission(submission_id) == "sent"
    adapter = get_provider(provider.name)
    for _ in range(200):
        clock.advance(ms=50)
        if poll_submission(submission_id, provider=adapter) == "collected":
            return job, Submission.objects.get(pk=submission_id)
    raise AssertionError(f"never collected: {job.items.counts_by_state()}")


def files_at(emulator, provider) -> set[str]:
    """The names of the files the provider holds, from its own listing, through its official SDK."""
    if provider.protocol == "openai":
        with openai.OpenAI(base_url=emulator.base_url, api_key="sk-test", max_retries=0) as sdk:
            return {file.id for file in sdk.files.list()}
    root = emulator.base_url.removesuffix("/v1beta")
    sdk = genai.Client(
        api_key="sdk-test-key", http_options=types.HttpOptions(base_url=root, api_version="v1beta")
    )
    return {file.name for file in sdk.files.list()}


def unit_files(emulator, provider, unit: Submission) -> set[str]:
    """The unit's own files as the provider names them (input, output, errors)."""
    if provider.protocol == "openai":
        batch = emulator.get_batch(unit.provider_ref)
        return {batch[key] for key in ("input_file_id", "output_file_id", "error_file_id") if batch[key]}
    operation = httpx.get(
        f"{emulator.base_url}/{unit.provider_ref}", headers={"x-goog-api-key": "gemini-test-key"}
    ).json()
    return {
        operation["metadata"]["inputConfig"]["fileName"],
        operation["metadata"]["output"]["responsesFile"],
    }


def asked_for(emulator, provider, name: str):
    """Ask the provider for one file through its official SDK (raises its not-found error)."""
    if provider.protocol == "openai":
        with openai.OpenAI(base_url=emulator.base_url, api_key="sk-test", max_retries=0) as sdk:
            return sdk.files.retrieve(name)
    root = emulator.base_url.removesuffix("/v1beta")
    sdk = genai.Client(
        api_key="sdk-test-key", http_options=types.HttpOptions(base_url=root, api_version="v1beta")
    )
    return sdk.files.get(name=name)


NOT_FOUND = (openai.NotFoundError, genai_errors.ClientError)


@pytest.mark.parametrize("provider", DELETING, ids=str)
def test_a_collected_units_files_are_deleted_at_the_provider_and_the_deletion_is_an_event(
    emulator, clock, provider
):
    job, unit = collected_job(provider, clock)
    files = unit_files(emulator, provider, unit)
    assert len(files) == 2 and files <= files_at(emulator, provider)
    assert unit.files_to_delete and unit.files_deleted_at is None
    assert set(job.items.counts_by_state()) == {ItemState.AWAITING_REVIEW}

    poll_everything()  # the pass finds the unit (its task, queued on commit, never ran here)

    unit.refresh_from_db()
    assert not unit.files_to_delete and unit.files_deleted_at is not None
    assert not files & files_at(emulator, provider)
    for name in files:
        with pytest.raises(NOT_FOUND):
            asked_for(emulator, provider, name)
    [deleted] = Event.objects.filter(submission=unit, data__has_key="provider_files_deleted")
    assert set(deleted.data["provider_files_deleted"]) == files
    assert (deleted.from_state, deleted.to_state) == (SubmissionState.COLLECTED, SubmissionState.COLLECTED)
    assert "deleted at the provider" in deleted.reason
    # Safe to run twice: nothing is asked of the provider again, and no second event.
    assert provider_files.delete_provider_files(unit.pk) == "nothing to delete"
    poll_everything()
    assert Event.objects.filter(submission=unit, data__has_key="provider_files_deleted").count() == 1
    # What was recorded stays: the drafts are the ledger's, not the provider's.
    assert set(job.items.counts_by_state()) == {ItemState.AWAITING_REVIEW}


@pytest.mark.parametrize("provider", DELETING, ids=str)
def test_with_keep_provider_files_the_files_stay_at_the_provider(emulator, clock, provider, settings):
    settings.BATCHDESK_KEEP_PROVIDER_FILES = True
    job, unit = collected_job(provider, clock)
    files = unit_files(emulator, provider, unit)

    for _ in range(2):
        poll_everything()
    assert provider_files.delete_provider_files(unit.pk) == "kept (BATCHDESK_KEEP_PROVIDER_FILES)"

    unit.refresh_from_db()
    assert not unit.files_to_delete and unit.files_deleted_at is None
    assert files <= files_at(emulator, provider)
    for name in files:
        assert asked_for(emulator, provider, name)
    assert not Event.objects.filter(submission=unit, data__has_key="provider_files_deleted").exists()


@pytest.mark.parametrize("provider", [BY_NAME["emulator"]], ids=str)
def test_a_provider_that_fails_to_delete_is_asked_again_on_a_later_pass_without_holding_anything_up(
    emulator, clock, provider
):
    job, unit = collected_job(provider, clock)
    files = unit_files(emulator, provider, unit)
    emulator.configure(server_errors=100, server_error_path="DELETE /v1/files")

    poll_everything()

    unit.refresh_from_db()
    assert unit.files_to_delete and unit.files_deleted_at is None
    assert unit.claimed_until > timezone.now()  # left alone a while
    assert files <= files_at(emulator, provider)
    # The collector goes on with everything else meanwhile: a second job is collected.
    other, other_unit = collected_job(provider, clock)
    assert set(other.items.counts_by_state()) == {ItemState.AWAITING_REVIEW}

    emulator.configure(server_errors=0)
    # The while has passed.
    Submission.objects.filter(pk=unit.pk).update(claimed_until=timezone.now() - timedelta(seconds=1))
    poll_everything()

    unit.refresh_from_db()
    assert not unit.files_to_delete and unit.files_deleted_at is not None
    assert not files & files_at(emulator, provider)


@pytest.mark.parametrize("provider", [BY_NAME["anthropic"], BY_NAME["cloudflare"]], ids=str)
def test_a_provider_with_no_files_to_delete_has_none_asked_for(emulator, clock, provider):
    job, unit = collected_job(provider, clock)
    assert not unit.files_to_delete
    poll_everything()
    unit.refresh_from_db()
    assert not unit.files_to_delete and unit.files_deleted_at is None
    assert not Event.objects.filter(submission=unit, data__has_key="provider_files_deleted").exists()


def test_the_pass_claims_every_free_waiting_unit_in_one_statement_and_leaves_held_ones():
    job = JobFactory()
    units = [
        Submission.objects.create(
            job=job,
            provider="openai",
            model="gpt-4o-mini",
            intent_key=f"bd_files_{n}",
            state=SubmissionState.COLLECTED,
            files_to_delete=True,
        )
        for n in range(4)
    ]
    held = Submission.objects.claim(units[1].pk, states=[SubmissionState.COLLECTED])
    with CaptureQueriesContext(connection) as queries:
        claimed = provider_files.claim_due()
    assert [pk for pk, _ in claimed] == [units[0].pk, units[2].pk, units[3].pk]
    assert len({token for _, token in claimed}) == 1
    assert len([q for q in queries if q["sql"].startswith("UPDATE")]) == 1
    assert Submission.objects.get(pk=units[1].pk).claimed_by == held
    assert provider_files.claim_due() == []  # all taken now
