"""The desk's comforts in a real browser on a phone's 390 px (issue 30, point 6): `?` shows the keys
(never while typing), and list mode opens a draft cut short in place."""

import pytest
from django.urls import reverse

from ledger.models import Item
from ledger.states import ItemState
from tests.factories import ItemFactory, add_version
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
    reason = page.get_by_placeholder("Why is it rejected?")
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
