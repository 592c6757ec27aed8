"""Rule 13 for a provider searched only by listing: a candidate is owned or ruled out by the
custom_ids of its results, and one whose results name nobody decides nothing.

The provider here is a stand-in: no emulator can end a batch whose every result line is
unreadable, so the stand-in plays the listing and the results; everything else is the ledger's."""

import pytest

from ledger.actions.submitting import operator_must_decide, reconcile_uncertain
from ledger.models import Item, Submission, SubmissionItem
from ledger.providers.anthropic import AnthropicBatchProvider
from ledger.providers.base import ResultLine, UnitStatus, UnreadableLine
from ledger.states import ItemState, SubmissionState
from tests.factories import ItemFactory, JobFactory

pytestmark = pytest.mark.django_db


class ListedProvider:
    """A provider whose listing shows one candidate that has ended with these results."""

    capabilities = AnthropicBatchProvider.capabilities

    def __init__(self, results):
        self.lines = results

    def find_units(self, *, intent_key, sent_at, request_count):
        return ["msgbatch_candidate"]

    def status(self, ref):
        return UnitStatus(provider_status="ended", ended=True)

    def results(self, ref, **_):
        yield from self.lines


@pytest.fixture
def lost(settings) -> Submission:
    settings.BATCHDESK_UNCERTAIN_GRACE_SECONDS = 0
    job = JobFactory(provider="anthropic")
    submission = Submission.objects.create(
        job=job, provider="anthropic", model="m", intent_key="bd_lost", state=SubmissionState.UNCERTAIN
    )
    for _ in range(2):
        item = ItemFactory(job=job, state=ItemState.SUBMISSION_UNCERTAIN, submission=submission)
        SubmissionItem.objects.create(submission=submission, item=item, custom_id=item.custom_id)
    return submission


def test_a_candidate_whose_results_name_nobody_leaves_the_choice_to_an_operator(lost):
    provider = ListedProvider([UnreadableLine(1, "{half a line", "not JSON")])

    assert reconcile_uncertain(lost.pk, provider=provider) == "waiting for an operator"

    lost.refresh_from_db()
    assert lost.state == SubmissionState.UNCERTAIN
    assert lost.candidates == {"msgbatch_candidate": "unconfirmed"}
    assert "without readable results" in operator_must_decide(lost)
    assert set(Item.objects.filter(submission=lost).values_list("state", flat=True)) == {
        ItemState.SUBMISSION_UNCERTAIN
    }


def test_a_candidate_whose_results_name_other_requests_is_ruled_out(lost):
    provider = ListedProvider([ResultLine(custom_id="bd-somebody-else-1", succeeded=True, content="x")])

    assert reconcile_uncertain(lost.pk, provider=provider) == "released"

    lost.refresh_from_db()
    assert lost.state == SubmissionState.FAILED
    assert lost.candidates == {"msgbatch_candidate": "ruled_out"}
    assert not operator_must_decide(lost)


def test_a_candidate_whose_results_name_ours_is_adopted(lost):
    ours = lost.entries.first().custom_id
    provider = ListedProvider([ResultLine(custom_id=ours, succeeded=True, content="x")])

    assert reconcile_uncertain(lost.pk, provider=provider) == "adopted"

    lost.refresh_from_db()
    assert (lost.state, lost.provider_ref) == (SubmissionState.OPEN, "msgbatch_candidate")
