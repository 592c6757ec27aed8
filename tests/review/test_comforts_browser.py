"""The desk's comforts in a real browser on a phone's 390 px (issue 30, point 6): `?` shows the keys
(never while typing), list mode opens a draft cut short in place, and a product is edited on its
page."""

import pytest
from django.urls import reverse

from ledger.models import Item, Product
from ledger.states import ItemState
from tests.factories import ItemFactory, ProductFactory, add_version
from tests.review.browser import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}


def test_question_mark_shows_the_keys_and_esc_or_question_mark_closes_them(page, live_server, owner):
    from playwright.sync_api import expect

    item = ItemFactory(awaiting_review=True)
    add_version(item, "A solid oak board, oiled.")
    page.set_viewport_size(PHONE)
    log_in(page, live_server, owner, then=reverse("review_queue"))
    help = page.get_by_test_id("keys-help")
    expect(help).to_be_hidden()

    page.keyboard.press("?")
    expect(help).to_be_visible()
    expect(help).to_contain_text("approve the draft")
    box = help.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    # While the list is open, the desk's keys do nothing behind it.
    page.keyboard.press("a")
    page.keyboard.press("Escape")
    expect(help).to_be_hidden()
    assert Item.objects.get(pk=item.pk).state == ItemState.AWAITING_REVIEW

    page.keyboard.press("?")
    expect(help).to_be_visible()
    page.keyboard.press("?")
    expect(help).to_be_hidden()

    # Typing a reason, `?` is a question mark.
    reason = page.get_by_placeholder("In your words (optional with a reason picked)")
    reason.click()
    page.keyboard.type("Oiled?")
    expect(reason).to_have_value("Oiled?")
    expect(help).to_be_hidden()

    # On a touch screen, a button opens it.
    page.get_by_role("button", name="Keys").click()
    expect(help).to_be_visible()
    page.get_by_test_id("keys-help-close").click()
    expect(help).to_be_hidden()


def test_question_mark_shows_the_keys_in_list_mode(page, live_server, owner):
    from playwright.sync_api import expect

    add_version(ItemFactory(awaiting_review=True), "A solid oak board, oiled.")
    page.set_viewport_size(PHONE)
    log_in(page, live_server, owner, then=reverse("review_queue") + "?mode=list")
    page.keyboard.press("?")
    expect(page.get_by_test_id("keys-help")).to_contain_text("reject the ticked drafts")
    page.keyboard.press("Escape")
    expect(page.get_by_test_id("keys-help")).to_be_hidden()


def test_list_mode_opens_a_draft_cut_short_in_place(page, live_server, owner):
    from playwright.sync_api import expect

    long = "An oak board. " * 30 + "The last sentence."
    item = ItemFactory(awaiting_review=True)
    add_version(item, long)
    short = ItemFactory(awaiting_review=True)
    add_version(short, "Short.")
    page.set_viewport_size(PHONE)
    log_in(page, live_server, owner, then=reverse("review_queue") + "?mode=list")
    row = page.get_by_test_id(f"row-{item.pk}")
    whole = row.get_by_test_id("draft-text")
    expect(whole).to_be_hidden()
    url = page.url

    row.get_by_text("Show the whole draft").click()
    expect(whole).to_be_visible()
    expect(whole).to_contain_text("The last sentence.")
    assert page.url == url, "the draft opened in place"
    row.get_by_text("Show less").click()
    expect(whole).to_be_hidden()
    # A draft shown whole has nothing to open.
    expect(page.get_by_test_id(f"row-{short.pk}").get_by_test_id("draft-whole")).to_have_count(0)


def test_a_product_is_edited_on_its_page_at_390_px_and_a_double_click_saves_once(page, live_server, owner):
    from playwright.sync_api import expect

    product = ProductFactory(
        sku="OAK-9", revision__title="Oak board", revision__fields={"price": 12, "tags": ["oak"]}
    )
    page.set_viewport_size(PHONE)
    log_in(page, live_server, owner, then=reverse("catalogue_product", args=[product.sku]))
    page.get_by_role("link", name="Edit").click()
    page.get_by_label("price", exact=True).fill("13")
    page.get_by_label("tags", exact=True).fill('["oak", "oiled"]')
    page.get_by_test_id("edit-preview").click()
    expect(page.get_by_test_id("edit-changes")).to_contain_text("oiled")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    page.get_by_test_id("edit-confirm").dblclick()
    expect(page.get_by_text("Saved as revision 2")).to_be_visible()
    revision = Product.objects.get(pk=product.pk).current_revision
    assert (revision.number, revision.fields) == (2, {"price": 13, "tags": ["oak", "oiled"]})
    assert product.revisions.count() == 2
