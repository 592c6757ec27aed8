"""The whole pipeline in real processes: an emulator speaking OpenAI's Batch protocol over HTTP,
a django-q2 worker cluster, and PostgreSQL. Nothing is mocked."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.db import connection

from ledger import actions
from ledger.models import Approval, Event, GeneratedVersion, Item, Product, Submission, SubmissionItem
from ledger.states import FINAL_STATES, ItemState, JobState
from ledger.tasks import install_schedules
from tests.factories import UserFactory

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True, serialized_rollback=True)]

ROOT = Path(__file__).resolve().parent.parent
SETTLED = {
    ItemState.AWAITING_REVIEW,
    ItemState.VALIDATION_FAILED,
    ItemState.INFERENCE_FAILED,
    ItemState.DEAD_LETTER,
    *FINAL_STATES,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, *, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def processes():
    """Start processes that share the test database; stop them before the database is flushed."""
    started: list[subprocess.Popen] = []
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "batchdesk.test_settings",
        "DATABASE_URL": f"postgres://{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "BATCHDESK_POLL_SECONDS": "1",
        "BATCHDESK_RETRY_BASE_SECONDS": "1",
        "PYTHONUNBUFFERED": "1",
    }

    def start(*args: str, extra_env: dict | None = None) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args],
            env={**env, **(extra_env or {})},
            cwd=ROOT,
            start_new_session=True,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in started:
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def start_emulator(processes, *flags: str) -> str:
    port = free_port()
    processes("run_emulator", "--port", str(port), *flags)
    url = f"http://127.0.0.1:{port}/v1"
    wait_until(lambda: reachable(url), timeout=30, what="the emulator")
    return url


def reachable(url: str) -> bool:
    try:
        httpx.get(f"{url}/batches", headers={"Authorization": "Bearer t"}, timeout=1)
    except httpx.TransportError:
        return False
    return True


def make_catalogue(n: int) -> list[str]:
    materials = ["oak", "beech", "walnut", "bamboo", "ash"]
    skus = []
    for i in range(n):
        sku = f"KIT-{i:05d}"
        actions.record_product(
            sku=sku,
            title=f"{materials[i % 5].title()} serving board no. {i}",
            fields={"material": materials[i % 5], "dimensions": f"{30 + i} x 20 cm", "care": "hand wash"},
        )
        skus.append(sku)
    return skus


def test_catalogue_to_published_text_through_real_processes(processes, settings):
    emulator_url = start_emulator(
        processes, "--per-request-ms", "5", "--fail-rate", "0.15", "--expire-rate", "0.1", "--seed", "11"
    )
    settings.PROVIDERS = {
        **settings.PROVIDERS,
        "emulator": {**settings.PROVIDERS["emulator"], "base_url": emulator_url},
    }
    worker_env = {"BATCHDESK_EMULATOR_URL": emulator_url}
    owner = UserFactory(roles=["catalogue_owner"])
    skus = make_catalogue(40)
    install_schedules()

    processes("qcluster", extra_env=worker_env)
    job = actions.create_job(
        reference="pipeline",
        owner=owner,
        task="product_description",
        provider="emulator",
        model="gpt-4o-mini",
        unit_size=8,
    )

    # Rule 1 holds at every moment we look, not only at the end.
    def settled():
        counts = job.items.counts_by_state()
        assert sum(counts.values()) == len(skus)
        return set(counts) <= SETTLED and counts

    counts = wait_until(settled, timeout=240, what="every item to settle")

    stats = httpx.get(emulator_url.removesuffix("/v1") + "/_emulator/stats", timeout=5).json()
    # Work that succeeded is never paid for twice: no custom_id was ever inferred twice.
    assert stats["inferences"] and max(stats["inferences"].values()) == 1
    assert Submission.objects.filter(job=job).count() >= len(skus) // 8
    # Failures and expiries happened, and each failed item was retried as its own new request.
    retried = Item.objects.filter(job=job, inference_attempt__gt=1)
    assert retried.exists()
    sent = set(SubmissionItem.objects.filter(item__job=job).values_list("custom_id", flat=True))
    # Each attempt was sent exactly once, and the provider only ever saw what the ledger sent.
    assert len(sent) == sum(i.inference_attempt for i in Item.objects.filter(job=job))
    assert set(stats["inferences"]) <= sent
    assert not SubmissionItem.objects.filter(item__job=job, outcome="").exists()
    for item in Item.objects.filter(job=job):
        assert item.versions.count() <= 1
        if item.state == ItemState.AWAITING_REVIEW:
            assert item.versions.get().valid is True
        elif item.state == ItemState.DEAD_LETTER:
            assert "Gave up after" in item.reason
    assert counts.get(ItemState.AWAITING_REVIEW, 0) >= len(skus) // 2

    # A reviewer approves every valid draft; the worker applies them.
    withdrawn_sku = Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW).first().product.sku
    Product.objects.filter(sku=withdrawn_sku).update(status="withdrawn")
    for item in Item.objects.filter(job=job, state=ItemState.AWAITING_REVIEW):
        version = item.versions.get()
        try:
            actions.approve_version(
                item_id=item.pk, version_id=version.pk, version_hash=version.content_hash, approver=owner
            )
        except actions.NotAllowed:
            assert item.product.sku == withdrawn_sku

    wait_until(
        lambda: not Item.objects.filter(job=job, state__in=[ItemState.APPROVED, ItemState.APPLYING]).exists(),
        timeout=60,
        what="approved drafts to be applied",
    )
    applied = Item.objects.filter(job=job, state=ItemState.APPLIED)
    assert applied.count() == Approval.objects.filter(item__job=job).count() > 0
    for item in applied.select_related("product", "approved_version"):
        assert item.product.published_content == item.approved_version.content
        assert item.product.published_version_id == item.approved_version_id
    assert Item.objects.get(job=job, product__sku=withdrawn_sku).state == ItemState.WITHDRAWN
    assert Product.objects.get(sku=withdrawn_sku).published_content == ""

    final_counts = job.items.counts_by_state()
    assert sum(final_counts.values()) == Item.objects.filter(job=job).count()
    # Every item's last event names the state it is in.
    for item in Item.objects.filter(job=job):
        assert Event.objects.filter(item=item).order_by("id").last().to_state == item.state
    assert (
        GeneratedVersion.objects.filter(item__job=job).count()
        == SubmissionItem.objects.filter(item__job=job, outcome="returned").count()
    )
    job.refresh_from_db()
    assert job.state in {JobState.IN_REVIEW, JobState.COMPLETED}
