import time
import pytest
from ledger.models import Item, Job
from ledger.states import ItemState, JobState
from tests.factories import ItemFactory, JobFactory
from tests.review.test_browser import page, log_in, leave_migration_data_behind  # noqa

pytestmark = [pytest.mark.django_db(transaction=True, serialized_rollback=True)]

def test_poll(page, live_server, owner):
    job = JobFactory(state=JobState.RUNNING)
    it = ItemFactory(job=job, submitted=True)
    reqs = []
    page.on("response", lambda r: reqs.append((r.url, r.status)))
    log_in(page, live_server, owner, then="/")
    assert "Sent to the provider" in page.inner_text("#jobs")
    Item.objects.filter(pk=it.pk).update(state=ItemState.AWAITING_REVIEW)
    page.wait_for_timeout(2600)
    assert "Draft ready for review: 1" in page.inner_text("#jobs")
    Job.objects.filter(pk=job.pk).update(state=JobState.IN_REVIEW)
    page.wait_for_timeout(2600)
    assert "In review" in page.inner_text("#jobs")
    n = len(reqs)
    page.wait_for_timeout(4500)
    print(reqs)
    assert len(reqs) == n, "polling stopped"
