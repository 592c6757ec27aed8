"""Operations and audit in a real browser: the system Chromium, driven by Playwright, against live_server."""

import csv
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from ledger.models import Approval, CollectorHeartbeat, Item, Submission
from ledger.states import ItemState, ReasonCode, SubmissionState
from review.operations import attention_groups
from tests.factories import ItemFactory, UserFactory, add_version
from tests.review.browser import log_in

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]

SERVER_ERROR = "server_error: The server had an error while processing your request. Sorry about that!"


def test_an_operator_retries_a_whole_group_once_the_count_is_confirmed(page, live_server, operator, job):
    from playwright.sync_api import expect

    failing = [
        ItemFactory(
            job=job,
            state=ItemState.INFERENCE_FAILED,
            reason=SERVER_ERROR,
            reason_code=ReasonCode.MODEL_SERVER_ERROR,
        )
        for _ in range(14)
    ]
    other = ItemFactory(
        job=job,
        state=ItemState.VALIDATION_FAILED,
        reason="Too short: 12 characters",
        reason_code=ReasonCode.TOO_SHORT,
    )
    [group] = [g for g in attention_groups() if g.state == ItemState.INFERENCE_FAILED]
    log_in(page, live_server, operator, then=reverse("operations"))

    box = page.get_by_test_id(f"group-{group.key}")
    expect(box).to_contain_text("The model produced no draft: server error")
    expect(box.get_by_test_id("group-count")).to_have_text("14 items")
    box.locator("summary").click()
    expect(box.get_by_test_id("group-items").locator("tbody tr")).to_have_count(14)

    box.get_by_role("link", name="Retry all in this group").click()
    expect(box.get_by_test_id("confirm")).to_contain_text("Retry 14 items?")
    assert Item.objects.filter(state=ItemState.INFERENCE_FAILED).count() == 14, (
        "nothing happens before confirming"
    )

    box.get_by_role("button", name="Yes, retry 14 items").click()
    expect(page.get_by_test_id("retry-summary")).to_have_text("Retried 14 items")
    expect(page.get_by_test_id("outcomes").locator("tbody tr")).to_have_count(14)
    ids = [item.pk for item in failing]
    assert set(Item.objects.filter(pk__in=ids).values_list("state", flat=True)) == {ItemState.PREPARED}
    assert Item.objects.get(pk=other.pk).state == ItemState.VALIDATION_FAILED


def test_an_admin_exports_the_filtered_approvals_as_csv(page, live_server, owner, job):
    from playwright.sync_api import expect

    bob = UserFactory(username="bob", roles=["catalogue_owner"])
    approvals = []
    for n, (person, final) in enumerate(
        [(owner, None), (bob, '=HYPERLINK("https://evil.example")'), (bob, None)]
    ):
        item = ItemFactory(job=job, state=ItemState.APPROVED, product__sku=f"OAK-{n}")
        version = add_version(item)
        approvals.append(
            Approval.objects.create(
                item=item,
                version=version,
                version_hash=version.content_hash,
                approved_by=person,
                final_content=final or version.content,
                edited=bool(final),
            )
        )
    admin = UserFactory(roles=["admin"])
    log_in(page, live_server, admin, then=reverse("audit"))
    page.get_by_label("Decided by").select_option("bob")
    page.get_by_role("button", name="Filter").click()
    expect(page.get_by_test_id("approvals").locator("tbody tr")).to_have_count(2)

    with page.expect_download() as download:
        page.get_by_test_id("export-csv").click()
    # utf-8-sig: the file starts with the byte-order mark spreadsheet programs need.
    with open(download.value.path(), encoding="utf-8-sig", newline="") as exported:
        rows = list(csv.DictReader(exported))

    bobs = sorted((a for a in approvals if a.approved_by == bob), key=lambda a: a.pk, reverse=True)
    assert [(r["sku"], r["decided_by"], r["content_hash"], r["job"]) for r in rows] == [
        (a.item.product.sku, "bob", a.version_hash, job.reference) for a in bobs
    ]
    assert rows[1]["final_content"] == "'" + '=HYPERLINK("https://evil.example")'
    assert rows[1]["edited"] == "yes" and rows[0]["edited"] == "no"


def test_a_stalled_collector_is_shown_with_since_when(page, live_server, owner, job, settings):
    from playwright.sync_api import expect

    settings.BATCHDESK_POLL_SECONDS = 30
    silent_since = timezone.now() - timedelta(minutes=10)
    heartbeat = CollectorHeartbeat.objects.create(name="collector", last_poll_at=silent_since)
    submission = Submission.objects.create(
        job=job,
        provider="emulator",
        model="m",
        intent_key="bd_stalled",
        state=SubmissionState.OPEN,
        provider_ref="batch_waiting",
        last_observed_at=silent_since,
        last_observed_status="in_progress",
    )
    log_in(page, live_server, owner, then=reverse("dashboard"))

    banner = page.get_by_test_id("collector-stalled")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("The collector has stalled: silent since")
    expect(banner.get_by_test_id("collector-silent-since")).to_have_text(
        silent_since.strftime("%Y-%m-%d %H:%M UTC")
    )
    expect(banner).to_contain_text("10 minutes ago")

    banner.get_by_role("link", name="See when each open submission was last observed").click()
    expect(page.get_by_test_id("collector-stalled")).to_be_visible()
    row = page.get_by_test_id(f"submission-{submission.pk}")
    expect(row).to_contain_text("batch_waiting")
    expect(row.get_by_test_id("last-observed")).to_have_text("10 minutes ago")

    heartbeat.last_poll_at = timezone.now()
    heartbeat.save()
    page.reload()
    expect(page.get_by_test_id("collector-stalled")).to_have_count(0)
