"""The review desk in a real browser: keys, editing, bulk approval and hostile drafts, on the system
Chromium driven by Playwright against live_server. Launch and fixtures as in test_browser.py."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from ledger.models import Approval, Item, Product
from ledger.states import ItemState
from tests.factories import ItemFactory, add_version
from tests.review.browser import log_in

# live_server needs committed data; each test ends with a flush, after which migrate's post_migrate step puts the roles, prompt and schedule back, as in a deployment.
pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]

XSS = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'


def queue_of(n: int) -> list:
    """`n` drafts waiting for review, oldest first."""
    now = timezone.now()
    drafts = []
    for i in range(n):
        item = ItemFactory(awaiting_review=True)
        drafts.append(add_version(item, f"Draft number {i + 1}: an oak board, {item.product.sku}."))
        Item.objects.filter(pk=item.pk).update(updated_at=now - timedelta(minutes=n - i))
    return drafts


def test_keys_step_through_drafts_and_approve_one_in_place(page, live_server, owner, apply_inline):
    from playwright.sync_api import expect

    drafts = queue_of(3)
    log_in(page, live_server, owner, then=reverse("review_queue"))
    position, draft = page.get_by_test_id("position"), page.get_by_test_id("draft")
    expect(position).to_have_text("1 of 3")
    page.evaluate("window.__samePage = true")

    page.keyboard.press("j")
    expect(position).to_have_text("2 of 3")
    expect(draft).to_have_text(drafts[1].content)
    assert "/review/?pos=2&after=" in page.url  # the cursor of the draft before it
    page.keyboard.press("k")
    expect(draft).to_have_text(drafts[0].content)
    page.keyboard.press("j")
    expect(position).to_have_text("2 of 3")

    page.keyboard.press("a")
    decided = page.get_by_test_id(f"review-card-{drafts[1].item_id}")
    expect(decided.get_by_test_id("outcome")).to_have_text("Approved — being applied")
    expect(position).to_have_text("2 of 2")
    expect(draft).to_have_text(drafts[2].content)
    assert page.evaluate("window.__samePage") is True, "the next draft came in place, not by a page load"
    assert Item.objects.get(pk=drafts[1].item_id).state == ItemState.APPLIED
    assert {i.state for i in Item.objects.exclude(pk=drafts[1].item_id)} == {ItemState.AWAITING_REVIEW}


def test_e_edits_the_draft_and_the_edited_text_is_published(page, live_server, owner, draft, apply_inline):
    from playwright.sync_api import expect

    item = draft.item
    log_in(page, live_server, owner, then=reverse("review_queue"))
    page.keyboard.press("e")
    text = page.get_by_label("Final text.")
    expect(text).to_be_focused()
    expect(text).to_have_value(draft.content)
    edited = "A jar of oak and ash; keys typed here (a, j, r) are text, not commands."
    text.fill("")
    text.press_sequentially(edited)
    expect(text).to_have_value(edited)
    assert not Approval.objects.exists()

    text.press("Control+Enter")
    expect(page.get_by_test_id("outcome")).to_have_text("Approved with your edits — being applied")
    approval = Approval.objects.get(item=item)
    assert approval.edited and approval.final_content == edited
    assert approval.version.content == draft.content
    assert Product.objects.get(pk=item.product_id).published_content == edited


def test_ticking_three_drafts_approves_three(page, live_server, owner, apply_inline):
    from playwright.sync_api import expect

    drafts = queue_of(4)
    log_in(page, live_server, owner, then=reverse("review_queue") + "?mode=list")
    button = page.get_by_test_id("approve-selected")
    expect(button).to_be_disabled()
    for draft in drafts[:3]:
        page.get_by_label(f"Select {draft.item.product.sku}").check()
    expect(button).to_have_text("Approve 3 drafts — 3 will be published")

    button.click()
    expect(page.get_by_test_id("messages")).to_contain_text("Approved 3 drafts; being applied.")
    assert set(Approval.objects.values_list("item_id", flat=True)) == {d.item_id for d in drafts[:3]}
    expect(page.get_by_test_id("list-count")).to_have_text("1 draft waiting, oldest first.")


def test_r_asks_for_a_reason_and_records_it(page, live_server, owner, draft):
    from playwright.sync_api import expect

    item = draft.item
    log_in(page, live_server, owner, then=reverse("review_queue"))
    page.keyboard.press("r")
    reason = page.get_by_label(f"Reason for rejecting {item.product.sku}")
    expect(reason).to_be_focused()
    expect(reason).to_have_value("")  # the key itself is not typed into the field
    reason.press("Enter")  # no reason picked, none written: refused on its own card
    expect(page.get_by_test_id("card-error")).to_contain_text("pick a reason or write one")
    assert Item.objects.get(pk=item.pk).state == ItemState.AWAITING_REVIEW

    reason.fill("Promises a lifetime warranty")
    reason.press("Enter")
    expect(page.get_by_test_id("outcome")).to_have_text("Rejected")
    expect(page.get_by_test_id("queue-empty")).to_be_visible()
    item.refresh_from_db()
    assert (item.state, item.reason) == (ItemState.REJECTED, "Promises a lifetime warranty")


def test_a_hostile_draft_stays_inert_in_focus_mode_list_mode_and_the_diff(page, live_server, owner):
    from playwright.sync_api import expect

    published = ItemFactory(awaiting_review=True)
    Product.objects.filter(pk=published.product_id).update(
        published_content="An oak board. " + XSS,
        published_version=add_version(ItemFactory(product=published.product, state=ItemState.APPLIED)),
        published_at=timezone.now(),
    )
    add_version(published, XSS + " An oak board.")
    fresh = ItemFactory(awaiting_review=True)
    add_version(fresh, XSS)
    Item.objects.filter(pk=fresh.pk).update(updated_at=timezone.now() + timedelta(minutes=1))

    log_in(page, live_server, owner, then=reverse("review_queue"))
    diff = page.get_by_test_id("diff")
    expect(diff.locator("ins")).to_have_text(XSS + " ")
    expect(diff.locator("del")).to_have_text(XSS)
    page.keyboard.press("j")
    expect(page.get_by_test_id("draft")).to_have_text(XSS)
    page.goto(live_server.url + reverse("review_queue") + "?mode=list")
    expect(page.get_by_test_id("preview")).to_have_text([XSS + " An oak board.", XSS])

    for url in ("?pos=1", "?mode=list"):
        page.goto(live_server.url + reverse("review_queue") + url)
        assert "<script>window.__xss=1</script>" in page.inner_text("main")
        assert page.evaluate("window.__xss") is None
        assert page.locator("main img").count() == 0


def test_back_after_a_bulk_approval_ticks_nothing_and_approves_only_what_is_ticked_then(
    page, live_server, owner, apply_inline
):
    """Rule 15: the page Back brings shows no tick, whether the browser keeps it in its cache or
    loads it again (its rows moved); ticking one more row approves that one alone."""
    from playwright.sync_api import expect

    drafts = queue_of(5)
    first_three = {d.item_id for d in drafts[:3]}
    log_in(page, live_server, owner, then=reverse("review_queue") + "?mode=list")
    for draft in drafts[:3]:
        page.get_by_label(f"Select {draft.item.product.sku}").check()
    page.get_by_test_id("approve-selected").click()
    expect(page.get_by_test_id("messages")).to_contain_text("Approved 3 drafts; being applied.")
    assert set(Approval.objects.values_list("item_id", flat=True)) == first_three

    page.go_back()
    expect(page.locator("input[name=draft]").first).to_be_visible()
    assert page.locator("input[name=draft]:checked").count() == 0
    page.get_by_label(f"Select {drafts[3].item.product.sku}").check()
    expect(page.get_by_test_id("approve-selected")).to_have_text("Approve 1 draft — 1 will be published")
    page.get_by_test_id("approve-selected").click()
    expect(page.get_by_test_id("messages")).to_contain_text("Approved 1 draft; being applied.")
    assert set(Approval.objects.values_list("item_id", flat=True)) == first_three | {drafts[3].item_id}
    assert Item.objects.get(pk=drafts[4].item_id).state == ItemState.AWAITING_REVIEW


def test_a_double_click_on_approve_acts_once(page, live_server, owner, apply_inline):
    from playwright.sync_api import expect

    drafts = queue_of(3)
    log_in(page, live_server, owner, then=reverse("review_queue"))
    page.get_by_role("button", name="Approve", exact=True).dblclick()
    expect(page.get_by_test_id("outcome")).to_have_text("Approved — being applied")
    expect(page.get_by_test_id("draft")).to_have_text(drafts[1].content)
    assert list(Approval.objects.values_list("item_id", flat=True)) == [drafts[0].item_id]

    page.goto(live_server.url + reverse("review_queue") + "?mode=list")
    page.get_by_label(f"Select {drafts[1].item.product.sku}").check()
    page.get_by_test_id("approve-selected").dblclick()
    expect(page.get_by_test_id("messages")).to_contain_text("Approved 1 draft; being applied.")
    expect(page.get_by_test_id("messages")).not_to_contain_text("Nothing was approved")
    assert Approval.objects.count() == 2
    assert Item.objects.get(pk=drafts[2].item_id).state == ItemState.AWAITING_REVIEW


def test_an_edit_into_something_false_is_refused_on_its_card_and_nothing_is_approved(
    page, live_server, owner, apply_inline
):
    from playwright.sync_api import expect

    drafts = queue_of(2)
    log_in(page, live_server, owner, then=reverse("review_queue"))
    page.keyboard.press("e")
    text = page.get_by_label("Final text.")
    false = "Waterproof, certified organic and award-winning! An oak board for every kitchen."
    text.fill(false)
    text.press("Control+Enter")
    card = page.get_by_test_id(f"review-card-{drafts[0].item_id}")
    expect(card.get_by_test_id("card-error")).to_contain_text("Claims “waterproof”")
    expect(card.get_by_test_id("card-error")).to_contain_text("Claims “award-winning”")
    expect(page.get_by_label("Final text.")).to_have_value(false)  # kept, to be put right
    assert not Approval.objects.exists()
    assert {i.state for i in Item.objects.all()} == {ItemState.AWAITING_REVIEW}

    page.get_by_label("Final text.").fill("")
    page.get_by_label("Final text.").press("Control+Enter")
    expect(card.get_by_test_id("card-error")).to_contain_text("The edited text is empty")
    assert not Approval.objects.exists()
    assert Product.objects.get(pk=drafts[0].item.product_id).published_content == ""


def test_enter_in_the_reason_rejects_the_ticked_drafts_and_approves_nothing(page, live_server, owner):
    from playwright.sync_api import expect

    drafts = queue_of(3)
    log_in(page, live_server, owner, then=reverse("review_queue") + "?mode=list")
    for draft in drafts[:2]:
        page.get_by_label(f"Select {draft.item.product.sku}").check()
    reason = page.get_by_label("Reason for rejecting the ticked drafts")
    reason.fill("Off brand")
    reason.press("Enter")
    expect(page.get_by_test_id("messages")).to_contain_text("Rejected 2 drafts.")
    assert not Approval.objects.exists()
    assert [Item.objects.get(pk=d.item_id).state for d in drafts] == [
        ItemState.REJECTED,
        ItemState.REJECTED,
        ItemState.AWAITING_REVIEW,
    ]


def test_a_decision_the_server_refuses_says_nothing_was_done(page, live_server, owner):
    """The desk's form expired (its person logged in again in another tab: a new CSRF token): the
    approval is refused with a 403 page that htmx does not swap in. The desk says nothing was done
    rather than seem to ignore the click, and the draft still waits."""
    from playwright.sync_api import expect

    drafts = queue_of(2)
    log_in(page, live_server, owner, then=reverse("review_queue"))
    expect(page.get_by_test_id("position")).to_have_text("1 of 2")
    context = page.context
    cookies = [
        {**cookie, "value": "A" * 32} if cookie["name"] == "csrftoken" else cookie
        for cookie in context.cookies()
    ]
    context.clear_cookies()
    context.add_cookies(cookies)

    page.keyboard.press("a")

    alert = page.get_by_test_id("messages").get_by_role("alert")
    expect(alert).to_have_text(
        "Nothing was done (Form expired). Reload the page, look at it again, and decide again."
    )
    expect(page.get_by_test_id("position")).to_have_text("1 of 2")
    assert not Approval.objects.exists()
    assert Item.objects.get(pk=drafts[0].item_id).state == ItemState.AWAITING_REVIEW
