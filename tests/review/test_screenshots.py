"""Screenshots for the README: the review queue, a job and the operations page, with a realistic job of
40 items in mixed states. Every run renders and checks them; only `make screenshots`
(BATCHDESK_SCREENSHOTS=1) writes them to docs/screenshots/, so running the suite changes no tracked file."""

import os
from datetime import timedelta
from itertools import cycle
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from ledger.models import (
    Approval,
    CollectorHeartbeat,
    GeneratedVersion,
    Item,
    Job,
    Product,
    Submission,
    SubmissionItem,
)
from ledger.states import ItemState, JobState, SubmissionState
from review.operations import attention_groups
from tests.factories import ItemFactory, JobFactory, ProductFactory, UserFactory, add_version
from tests.review.browser import log_in

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]

README_SCREENSHOTS = Path(settings.BASE_DIR) / "docs" / "screenshots"
VIEWPORT = {"width": 1366, "height": 900}
S = ItemState

MATERIALS = ["oak", "walnut", "beech", "acacia", "bamboo", "olive wood", "ash", "cherry"]
GOODS = [
    ("chopping board", "40 x 25 cm"),
    ("serving tray", "45 x 30 cm"),
    ("salad bowl", "28 cm across"),
    ("rolling pin", "45 cm long"),
    ("pepper mill", "22 cm tall"),
]
# How many of the 40 items stop in each state, as a running job leaves them.
MIX = [
    (S.AWAITING_REVIEW, 12),
    (S.APPLIED, 8),
    (S.APPROVED, 3),
    (S.INFERENCE_FAILED, 4),
    (S.VALIDATION_FAILED, 3),
    (S.DESTINATION_REJECTED, 2),
    (S.DEAD_LETTER, 2),
    (S.SUBMITTED, 3),
    (S.SUBMISSION_UNCERTAIN, 1),
    (S.REJECTED, 1),
    (S.PREPARED, 1),
]
REASONS = {
    S.INFERENCE_FAILED: "server_error: The server had an error while processing your request. Sorry about that!",
    S.VALIDATION_FAILED: "Claims “waterproof”, which the product's source does not state",
    S.DESTINATION_REJECTED: "product locked: the record is being edited in the PIM",
    S.DEAD_LETTER: "Gave up after 3 attempts: batch_expired: The batch expired before it could run",
    S.SUBMISSION_UNCERTAIN: "The provider's answer to the submission was lost; checking with the provider",
    S.REJECTED: "Too generic: say what the finish is",
}


def draft_for(material: str, good: str, size: str) -> str:
    return (
        f"A {good} turned from solid {material}, {size}, finished with food-safe oil so the grain stays "
        f"warm and the surface stays easy to clean. Wipe with a damp cloth and re-oil now and then."
    )


def realistic_job() -> Job:
    person = UserFactory(username="maria", roles=["catalogue_owner", "operator"])
    job = JobFactory(reference="spring-2026-kitchen", owner=person, state=JobState.RUNNING)
    now = timezone.now()
    unit = Submission.objects.create(
        job=job,
        provider="emulator",
        model=job.model,
        intent_key="bd_screens_1",
        state=SubmissionState.OPEN,
        provider_ref="batch_68a1f0c2e4b9",
        last_observed_at=now - timedelta(seconds=40),
        last_observed_status="in_progress",
        request_counts={"total": 3, "completed": 1, "failed": 0},
    )
    lost = Submission.objects.create(
        job=job,
        provider="emulator",
        model=job.model,
        intent_key="bd_screens_2",
        state=SubmissionState.UNCERTAIN,
    )
    products = ((m, g, s) for m in MATERIALS for g, s in GOODS)
    ages = cycle([5, 12, 30, 55, 90, 140, 200])
    for state, count in MIX:
        for _ in range(count):
            material, good, size = next(products)
            sku = f"KIT-{material[:3].upper()}-{good.split()[0][:4].upper()}"
            title = f"{material.title()} {good}"
            product = ProductFactory(
                sku=sku, revision__title=title, revision__fields={"material": material, "size": size}
            )
            item = ItemFactory(job=job, product=product, state=state, reason=REASONS.get(state, ""))
            text = draft_for(material, good, size)
            if state in (S.AWAITING_REVIEW, S.APPLIED, S.APPROVED, S.DESTINATION_REJECTED, S.REJECTED):
                version = add_version(item, text)
            if state == S.VALIDATION_FAILED:
                add_version(item, text + " Fully waterproof.", valid=False, reasons=[REASONS[state]])
            if state in (S.APPLIED, S.APPROVED, S.DESTINATION_REJECTED):
                final = text.replace("now and then", "once a month") if state == S.APPROVED else text
                Approval.objects.create(
                    item=item,
                    version=version,
                    version_hash=version.content_hash,
                    approved_by=person,
                    final_content=final,
                    edited=final != text,
                )
                item.approved_version = version
            if state == S.APPLIED:
                Product.objects.filter(pk=product.pk).update(
                    published_content=text, published_version=version, published_revision=1, published_at=now
                )
            if state in (S.SUBMITTED, S.SUBMISSION_UNCERTAIN):
                item.submission = unit if state == S.SUBMITTED else lost
                SubmissionItem.objects.create(submission=item.submission, item=item, custom_id=item.custom_id)
            item.save()
            Item.objects.filter(pk=item.pk).update(updated_at=now - timedelta(minutes=next(ages)))
    CollectorHeartbeat.objects.create(name="collector", last_poll_at=now - timedelta(seconds=20))
    assert Item.objects.filter(job=job).count() == 40 and GeneratedVersion.objects.exists()
    return job


def shoot(browser_page, path: Path) -> Path:
    browser_page.screenshot(path=str(path))
    return path


def written_at() -> dict[Path, int]:
    return {path: path.stat().st_mtime_ns for path in README_SCREENSHOTS.glob("*")}


@pytest.fixture
def screenshots(tmp_path):
    """docs/screenshots/ when asked for (`make screenshots`), otherwise a directory of this test's own."""
    if os.environ.get("BATCHDESK_SCREENSHOTS") == "1":
        README_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        yield README_SCREENSHOTS
        return
    before = written_at()
    yield tmp_path
    assert written_at() == before, "a test run must not rewrite the README's screenshots"


def test_screenshots_of_the_review_queue_a_job_and_operations(page, live_server, screenshots):
    job = realistic_job()
    page.set_viewport_size(VIEWPORT)
    log_in(page, live_server, job.owner, then=reverse("review_queue"))
    page.wait_for_load_state("networkidle")
    written = [shoot(page, screenshots / "review-queue.png")]

    page.goto(live_server.url + reverse("job_detail", args=[job.pk]))
    page.wait_for_load_state("networkidle")
    written.append(shoot(page, screenshots / "job.png"))

    failed = next(g for g in attention_groups() if g.state == S.INFERENCE_FAILED)
    page.goto(f"{live_server.url}{reverse('operations')}?group={failed.key}")
    page.wait_for_load_state("networkidle")
    written.append(shoot(page, screenshots / "operations.png"))

    for path in written:
        assert path.exists(), path
        assert path.stat().st_size > 20_000, f"{path} looks empty"
        assert path.read_bytes().startswith(b"\x89PNG"), path
