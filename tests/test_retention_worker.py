"""The retention pass runs by itself where a deployment runs `migrate` then `qcluster` (SPEC §11):
the schedule `migrate` installs is taken by a real worker cluster, which erases an old unusable
draft's text and writes its item's event."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from ledger.models import Event, GeneratedVersion, Item, content_hash
from ledger.states import ItemState
from tests.factories import ItemFactory, add_version
from tests.processes import wait_until

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]


def test_a_worker_cluster_runs_the_scheduled_retention_pass(processes):
    call_command("migrate", verbosity=0)  # what a deployment runs; it installs the schedule
    item = ItemFactory(state=ItemState.REJECTED)
    text = "A rejected draft, kept for the retention period and no longer"
    draft = add_version(item, text)
    long_ago = timezone.now() - timedelta(days=91)
    GeneratedVersion.objects.filter(pk=draft.pk).update(created_at=long_ago)
    Item.objects.filter(pk=item.pk).update(updated_at=long_ago)

    processes.start("qcluster")

    # django-q2's scheduler first looks for due schedules about 30 s after the cluster starts.
    wait_until(
        lambda: GeneratedVersion.objects.filter(pk=draft.pk, content_expired_at__isnull=False).exists(),
        timeout=120,
        what="the scheduled retention pass to erase the draft",
    )
    draft.refresh_from_db()
    assert (draft.content, draft.content_hash, draft.content_length) == ("", content_hash(text), len(text))
    assert Event.objects.filter(item=item, to_state="content_expired").count() == 1
