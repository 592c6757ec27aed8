"""A worker cluster that stops when asked (issue 17, point 9): a real `qcluster`, in the middle of a
long collection from a real emulator and of the collector's round, gets SIGTERM (alone, as
Kubernetes and systemd's KillMode=mixed send it, or with its whole process group, as a terminal's
Ctrl-C or systemd's default does). It ends within 30 s, every process of it, and the collection's
claim is handed over: another worker collects the unit at once, and nothing is asked for twice."""

import os
import signal
import subprocess

import httpx
import pytest
from django.utils import timezone
from django_q.tasks import async_task

from ledger.models import Item, Submission
from ledger.states import ItemState, SubmissionState
from tests.processes import emulator_stats, wait_until
from tests.provider_emulators import BY_NAME
from tests.test_worker_faults import start_job

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]

PRODUCTS = 120
STOP_WITHIN_SECONDS = 30


def group_is_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("to_whom", ["the cluster", "its process group"])
def test_a_cluster_asked_to_stop_hands_its_collection_over_and_ends_within_30_s(processes, to_whom):
    provider = BY_NAME["openai_compatible"]
    # A server answering a request a second, four at a time: collecting the unit takes half a minute.
    emulator_url = processes.emulator("--per-request-ms", "1000", provider=provider)
    _, job = start_job(PRODUCTS, unit_size=PRODUCTS, provider=provider)
    cluster = processes.start("qcluster")
    async_task("ledger.tasks.collect_round")
    wait_until(
        lambda: 4 <= Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).count() < PRODUCTS / 2,
        timeout=120,
        what="the collection to be under way",
        every=0.2,
    )

    if to_whom == "the cluster":
        cluster.send_signal(signal.SIGTERM)
    else:
        os.killpg(cluster.pid, signal.SIGTERM)
    try:
        cluster.wait(timeout=STOP_WITHIN_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"qcluster still running {STOP_WITHIN_SECONDS} s after SIGTERM to {to_whom}")
    wait_until(lambda: group_is_gone(cluster.pid), timeout=5, what="every process of the cluster to end")

    # The collection stopped part way, and let go of its unit.
    collected = Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).count()
    assert collected < PRODUCTS
    submission = Submission.objects.get(job=job)
    assert submission.state == SubmissionState.ENDED
    assert submission.claimed_until is None or submission.claimed_until < timezone.now()
    # Another worker takes it at once, not when a lease runs out.
    another = Submission.objects.claim(submission.pk, states=[SubmissionState.ENDED])
    assert another
    Submission.objects.release(submission.pk)

    # The rest is answered at once: what the next cluster proves is that it takes the unit over and
    # asks for nothing twice, not how long a slow server takes (half a minute more at 1 s a request).
    answer_quickly = httpx.post(
        str(httpx.URL(emulator_url).join("/_emulator/config")), json={"per_request_ms": 10}, timeout=5
    )
    assert answer_quickly.status_code == 200, answer_quickly.text
    processes.start("qcluster")
    async_task("ledger.tasks.collect_round")
    wait_until(
        lambda: Submission.objects.filter(pk=submission.pk, state=SubmissionState.COLLECTED).exists(),
        timeout=120,
        what="the unit to be collected by the next cluster",
    )
    assert Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).count() == PRODUCTS
    for item in Item.objects.filter(job=job):
        assert item.versions.count() == 1
    # Each request was asked once: the answers asked for before the stop were recorded, not asked again.
    assert max(emulator_stats(emulator_url)["inferences"].values()) == 1
