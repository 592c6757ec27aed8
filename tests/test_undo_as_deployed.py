"""Undo as deployed (SPEC §8): a real worker cluster holds an approval for BATCHDESK_UNDO_SECONDS and
applies it after; an approval undone within the window is never applied."""

import time

import pytest
from django.test import override_settings
from django.utils import timezone
from django_q.tasks import async_task

from ledger.actions.reviewing import approve_version, undo_decision
from ledger.models import DestinationAttempt, Item
from ledger.states import ItemState
from tests.factories import ItemFactory, UserFactory, add_version
from tests.processes import wait_until

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]

WINDOW = 4


@override_settings(BATCHDESK_UNDO_SECONDS=WINDOW)
def test_the_worker_applies_an_approval_only_after_its_undo_window(processes):
    owner = UserFactory(roles=["catalogue_owner"])
    kept, undone = (add_version(ItemFactory(awaiting_review=True), f"Draft {n}.") for n in (1, 2))
    processes.start("qcluster", BATCHDESK_UNDO_SECONDS=str(WINDOW), BATCHDESK_POLL_SECONDS="1")
    async_task("ledger.tasks.collect_round")
    approved_at = timezone.now()
    for draft in (kept, undone):
        approve_version(
            item_id=draft.item_id, version_id=draft.pk, version_hash=draft.content_hash, approver=owner
        )
    undo_decision(item_id=undone.item_id, actor=owner)

    time.sleep(WINDOW / 2)  # the worker's passes see the approval, held
    assert Item.objects.get(pk=kept.item_id).state == ItemState.APPROVED
    assert not DestinationAttempt.objects.exists()

    wait_until(
        lambda: Item.objects.get(pk=kept.item_id).state == ItemState.APPLIED,
        timeout=60,
        what="the approval applied",
    )
    attempt = DestinationAttempt.objects.get()
    assert attempt.item_id == kept.item_id
    assert (attempt.started_at - approved_at).total_seconds() >= WINDOW
    assert Item.objects.get(pk=undone.item_id).state == ItemState.AWAITING_REVIEW
