"""The review queue in a real browser: the system Chromium, driven by Playwright, against live_server."""

import pytest
from django.urls import reverse

from ledger.models import Product
from tests.factories import ItemFactory, add_version
from tests.review.browser import log_in

# live_server needs committed data; each test ends with a flush, after which migrate's post_migrate step puts the roles, prompt and schedule back, as in a deployment.
pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]


def test_a_catalogue_owner_approves_a_draft_in_place_and_it_is_published(
    page, live_server, owner, draft, apply_inline
):
    from playwright.sync_api import expect

    item = draft.item
    log_in(page, live_server, owner, then=reverse("review_queue"))
    card = page.get_by_test_id(f"review-card-{item.pk}")
    expect(card.get_by_test_id("draft")).to_have_text(draft.content)
    page.evaluate("window.__samePage = true")

    card.get_by_role("button", name="Approve").click()

    expect(card.get_by_test_id("outcome")).to_have_text("Approved — being applied")
    expect(card).to_contain_text("Now: Published to the destination")
    expect(card.get_by_role("button", name="Approve")).to_have_count(0)
    assert page.evaluate("window.__samePage") is True, "the card was replaced in place, not by a reload"
    assert page.url == live_server.url + reverse("review_queue")

    page.goto(live_server.url + reverse("item_detail", args=[item.pk]))
    expect(page.get_by_test_id("item-state")).to_have_text("Applied Published to the destination")
    expect(page.get_by_test_id("published-text")).to_have_text(draft.content)
    assert Product.objects.get(pk=item.product_id).published_content == draft.content


def test_a_hostile_draft_is_shown_as_text_and_never_runs(page, live_server, owner):
    from playwright.sync_api import expect

    hostile = '<script>window.__xss = 1</script><img src=x onerror="window.__xss=2">'
    item = ItemFactory(awaiting_review=True)
    add_version(item, hostile)
    log_in(page, live_server, owner, then=reverse("review_queue"))

    draft = page.get_by_test_id(f"review-card-{item.pk}").get_by_test_id("draft")
    expect(draft).to_have_text(hostile)
    assert "<script>" in page.inner_text("main")
    assert page.evaluate("window.__xss") is None
    assert page.locator("main img").count() == 0
