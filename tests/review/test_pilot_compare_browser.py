"""A reviewer compares two arms' drafts blind with the keyboard, at a phone's 390 px (issue 30 point 5):
the drafts stack, each key records its answer in place (htmx) and brings the next pair, and the pilot
report counts the answers."""

import pytest
from django.urls import reverse

from ledger.models import ArmPreference, Preference
from tests.pilots import same_sample_arms
from tests.review.browser import log_in
from tests.review.test_narrow_screens import OVERFLOWING, PHONE

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def arm_1_side(page) -> str:
    return "left" if "A sturdy oak board" in page.get_by_test_id("draft-left").inner_text() else "right"


def test_a_reviewer_compares_pairs_with_the_keyboard_on_a_phone(page, live_server, owner):
    jobs = same_sample_arms(owner, products=3)
    page.set_viewport_size(PHONE)
    address = reverse("pilot_compare", args=[jobs[0].pk])
    log_in(page, live_server, owner, then=address)

    card = page.get_by_test_id("compare-card")
    assert page.evaluate(OVERFLOWING) == []
    # Stacked: the right draft is below the left one, and the source below both.
    left, right = (
        page.get_by_test_id("draft-left").bounding_box(),
        page.get_by_test_id("draft-right").bounding_box(),
    )
    source = page.get_by_test_id("compare-source").bounding_box()
    assert right["y"] >= left["y"] + left["height"] and source["y"] >= right["y"] + right["height"]
    # The draft's markup is shown as text.
    assert (
        "<b>and</b>"
        in page.get_by_test_id(f"draft-{'right' if arm_1_side(page) == 'left' else 'left'}").inner_text()
    )

    # 1 prefers the left draft: the answer is recorded and the next pair comes in place.
    first_sku = card.get_by_role("heading", level=2).inner_text()
    first_side = arm_1_side(page)
    page.keyboard.press("1")
    page.get_by_test_id("compare-outcome").wait_for()
    assert page.get_by_test_id("compare-outcome").inner_text() == "Recorded: you preferred the left draft."
    assert card.get_by_role("heading", level=2).inner_text() != first_sku
    assert page.url == live_server.url + address  # swapped in place, no page load
    # 2 prefers the right one, then b: both.
    second_side = arm_1_side(page)
    page.keyboard.press("2")
    page.get_by_test_id("compare-outcome").filter(has_text="the right draft").wait_for()
    page.keyboard.press("b")
    page.get_by_test_id("compare-done").wait_for()
    assert page.evaluate(OVERFLOWING) == []

    answers = list(ArmPreference.objects.order_by("decided_at").values_list("preference", flat=True))
    assert answers == [
        Preference.A if first_side == "left" else Preference.B,
        Preference.A if second_side == "right" else Preference.B,
        Preference.BOTH,
    ]
    page.goto(live_server.url + reverse("pilot_report", args=[jobs[0].pk]))
    assert "Blind comparisons: 3:" in page.get_by_test_id("pair-preference").inner_text()
    assert page.evaluate(OVERFLOWING) == []


def test_without_javascript_the_buttons_are_forms_that_work(page, live_server, owner):
    jobs = same_sample_arms(owner, products=2)
    address = reverse("pilot_compare", args=[jobs[0].pk])
    plain = page.context.browser.new_context(java_script_enabled=False, viewport=PHONE).new_page()
    plain.set_default_timeout(5000)
    log_in(plain, live_server, owner, then=address)

    plain.get_by_role("button", name="Neither").click()

    plain.wait_for_url(live_server.url + address)
    assert "Recorded: you preferred neither draft." in plain.get_by_test_id("messages").inner_text()
    assert plain.get_by_test_id("compare-card").is_visible()
    plain.context.close()
    assert list(ArmPreference.objects.exclude(preference="").values_list("preference", flat=True)) == [
        "neither"
    ]
