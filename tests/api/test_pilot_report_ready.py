"""`job.pilot_report_ready` (SPEC §6): told once, with the decision that first lets the pilot's report
project its scope, the moment `GET /api/jobs/{id}/pilot` stops answering 409."""

import json

import pytest

from ledger.actions.job_states import refresh_job_state
from ledger.actions.jobs import create_job
from ledger.actions.reviewing import approve_version
from ledger.models import JobNotification
from ledger.notices.notifications import PILOT_REPORT_READY
from ledger.pilots.sample import PilotPlan
from tests.factories import ProductFactory
from tests.pilots import draft

pytestmark = pytest.mark.django_db


def test_a_pilots_report_is_announced_ready_once_with_the_decision_that_makes_it(as_owner, owner):
    for n in range(3):
        ProductFactory(sku=f"p-{n}", revision__fields={"category": "kitchen"})
    job = create_job(
        reference="told-pilot",
        owner=owner,
        task="product_description",
        provider="emulator",
        pilot=PilotPlan(per_stratum=3, strata=(), seed=1),
        notify_url="http://127.0.0.1:9/events",
    )
    drafts = [draft(item, 100, 50) for item in job.items.order_by("id")]
    ready = JobNotification.objects.filter(job=job, event_type=PILOT_REPORT_READY)

    for version in drafts[:2]:
        approve_version(
            item_id=version.item_id, version_id=version.pk, version_hash=version.content_hash, approver=owner
        )
        assert not ready.exists()
        assert as_owner.get(f"/api/jobs/{job.pk}/pilot").status_code == 409

    last = drafts[2]
    approve_version(item_id=last.item_id, version_id=last.pk, version_hash=last.content_hash, approver=owner)
    assert as_owner.get(f"/api/jobs/{job.pk}/pilot").status_code == 200
    event = json.loads(bytes(ready.get().body))
    assert event["type"] == PILOT_REPORT_READY and event["job"]["id"] == job.pk

    refresh_job_state(job.pk)
    assert ready.count() == 1
