"""A decision its reviewer undid is no decision in a pilot's measurements (SPEC §8, undo): its
rejection is not counted, nor its time; the decision taken after it is."""

from datetime import timedelta

import pytest
from django.test import override_settings

from ledger.actions.reviewing import reject_version, undo_decision
from ledger.models import Event
from ledger.pilots.measure import observe
from ledger.states import ItemState
from tests.pilots import SHOWN_AT, clock_at, known_pilot

pytestmark = pytest.mark.django_db


def garden(job) -> tuple:
    observed = observe(job.pilot, None)
    stratum = next(s for s in job.pilot.strata_drawn.all() if s.values == {"category": "garden"})
    seen = observed[stratum.number]
    return seen.approvals, seen.rejections, seen.decisions, len(seen.decision_seconds)


@override_settings(BATCHDESK_UNDO_SECONDS=30)
def test_an_undone_rejection_is_not_measured_and_the_next_decision_is(owner):
    job = known_pilot(owner)
    assert garden(job) == (0, 1, 1, 1)
    rejection = Event.objects.rejections().get(item__job=job)
    item, reviewer = rejection.item, rejection.actor
    with clock_at(SHOWN_AT + timedelta(seconds=40)):
        undo_decision(item_id=item.pk, actor=reviewer)
    assert garden(job) == (0, 0, 0, 0)
    with clock_at(SHOWN_AT + timedelta(seconds=50)):
        reject_version(
            item_id=item.pk, version_id=rejection.data["version"], reviewer=reviewer, reason_code="tone"
        )
    assert garden(job) == (0, 1, 1, 1)
    item.refresh_from_db()
    assert item.state == ItemState.REJECTED
