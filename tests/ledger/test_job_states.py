"""Job states say what happened (SPEC §2, issue 18 point 4): `needs_attention` when nothing is in
flight, nothing waits for a reviewer and at least one item waits for an operator; `completed` only
when none does."""

import pytest
from django.urls import reverse

from ledger.actions.job_states import refresh_job_state
from ledger.actions.jobs import create_job
from ledger.actions.operating import retry_item
from ledger.actions.prompts import create_prompt_version
from ledger.models import Event, Job, PromptVersion
from ledger.states import OPERATOR_STATES, ItemState, JobState
from tests.api.conftest import ApiClient, token_for
from tests.collector import poll_everything
from tests.factories import ItemFactory, JobFactory, ProductFactory, UserFactory
from tests.ledger.test_provider_faults import emulator  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db

S = ItemState


def job_in(*states: str) -> Job:
    job = JobFactory(state=JobState.RUNNING)
    for state in states:
        ItemFactory(job=job, state=state)
    return job


@pytest.mark.parametrize("waiting", OPERATOR_STATES)
def test_an_item_waiting_for_an_operator_makes_a_job_at_rest_need_attention(waiting):
    job = job_in(S.APPLIED, S.REJECTED, S.OBSOLETE, waiting)
    assert refresh_job_state(job.pk) == JobState.NEEDS_ATTENTION
    assert Job.objects.get(pk=job.pk).state == JobState.NEEDS_ATTENTION
    # The change is an event of the job, like every other.
    event = Event.objects.filter(job=job, item=None).latest("pk")
    assert (event.from_state, event.to_state) == (JobState.RUNNING, JobState.NEEDS_ATTENTION)


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        # Something in flight: running, whatever waits for an operator meanwhile.
        ((S.VALIDATION_FAILED, S.SUBMITTED), JobState.PREPARING),  # no unit sent yet
        ((S.DEAD_LETTER, S.RETURNED), JobState.PREPARING),
        # A draft with a reviewer, or on its way to the destination: in review.
        ((S.VALIDATION_FAILED, S.AWAITING_REVIEW), JobState.IN_REVIEW),
        ((S.DESTINATION_REJECTED, S.APPLYING), JobState.IN_REVIEW),
        # At rest, nothing for an operator (a rejected draft was decided on): completed.
        ((S.APPLIED, S.REJECTED, S.OBSOLETE, S.WITHDRAWN, S.CANCELLED), JobState.COMPLETED),
        (
            (S.INFERENCE_FAILED, S.VALIDATION_FAILED, S.DESTINATION_REJECTED, S.DEAD_LETTER),
            JobState.NEEDS_ATTENTION,
        ),
    ],
)
def test_what_is_outstanding_or_waiting_for_a_reviewer_comes_first(states, expected):
    assert refresh_job_state(job_in(*states).pk) == expected


def test_a_cancelled_job_stays_cancelled():
    job = JobFactory(state=JobState.CANCELLED)
    ItemFactory(job=job, state=S.DEAD_LETTER)
    assert refresh_job_state(job.pk) == JobState.CANCELLED


def test_an_operator_acting_brings_a_job_back_from_needs_attention(emulator):  # noqa: F811
    owner = UserFactory(roles=["catalogue_owner"])
    job = JobFactory(owner=owner, state=JobState.RUNNING)
    failed = ItemFactory(job=job, state=S.INFERENCE_FAILED)
    assert refresh_job_state(job.pk) == JobState.NEEDS_ATTENTION
    retry_item(failed.pk, unit="inference", actor=UserFactory(roles=["operator"]))
    assert Job.objects.get(pk=job.pk).state == JobState.PREPARING  # its item is to be sent again


def test_a_job_whose_drafts_all_failed_validation_needs_attention_not_a_green_completed(emulator, client):  # noqa: F811
    """The issue's case: a stricter prompt version makes every draft unusable."""
    owner = UserFactory(roles=["catalogue_owner"])
    v1 = PromptVersion.objects.get(task="product_description", version=1)
    create_prompt_version(
        task="product_description",
        system_message=v1.system_message,
        template=v1.template,
        output_schema=v1.output_schema,
        rules={**v1.rules, "min_length": 1, "max_length": 10},
        max_output_tokens=v1.max_output_tokens,
    )
    for _ in range(3):
        ProductFactory()
    job = create_job(
        reference="strict",
        owner=owner,
        task="product_description",
        provider="emulator",
        prompt_version=2,
        unit_size=5,
    )
    for _ in range(200):
        poll_everything()
        if job.items.counts_by_state() == {S.VALIDATION_FAILED: 3}:
            break
    assert job.items.counts_by_state() == {S.VALIDATION_FAILED: 3}
    assert set(job.items.values_list("reason_code", flat=True)) == {"too_long"}

    job.refresh_from_db()
    assert job.state == JobState.NEEDS_ATTENTION

    body = ApiClient(token_for(owner)).get(f"/api/jobs/{job.pk}").json()
    assert body["state"] == "needs_attention"
    assert body["label"] == JobState.NEEDS_ATTENTION.label
    assert body["needs_attention"] == 3

    client.force_login(owner)
    page = client.get(reverse("job_detail", args=[job.pk])).content.decode()
    assert 'data-state="needs_attention"' in page and 'data-state="completed"' not in page
    assert "3 items need attention" in page
    listed = client.get(reverse("job_list"), {"state": "needs_attention"}).content.decode()
    row = f'data-testid="job-{job.pk}"'
    assert row in listed
    assert row not in client.get(reverse("job_list"), {"state": "completed"}).content.decode()
