"""Two reviewers on one queue in real browsers (SPEC §8): each is shown a draft of their own, decides
with the keys (a reason picked by its number), and undoes a decision with `u`; the second works on a
390 px phone."""

import pytest
from django.test import override_settings
from django.urls import reverse

from ledger.models import Event, Item, ReviewClaim
from ledger.states import ItemState
from tests.factories import UserFactory
from tests.review.browser import log_in
from tests.review.drafts import queue_of

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@override_settings(BATCHDESK_UNDO_SECONDS=30)
def test_two_reviewers_on_one_queue(page, live_server, owner):
    from playwright.sync_api import expect

    drafts = queue_of(3)
    first, second, third = (draft.item_id for draft in drafts)
    colleague = UserFactory(roles=["catalogue_owner"], username="colleague")
    log_in(page, live_server, owner, then=reverse("review_queue"))
    expect(page.get_by_test_id(f"review-card-{first}")).to_be_visible()

    phone = page.context.browser.new_page(viewport={"width": 390, "height": 844})
    try:
        log_in(phone, live_server, colleague, then=reverse("review_queue"))
        # The colleague is shown the next draft: the first is open on the owner's desk.
        expect(phone.get_by_test_id(f"review-card-{second}")).to_be_visible()
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
        assert {claim.item_id: claim.reviewer for claim in ReviewClaim.objects.all()} == {
            first: owner,
            second: colleague,
        }

        # The owner rejects with the keys: r, then 3 picks the third reason (tone), Enter sends it.
        page.keyboard.press("r")
        page.keyboard.press("3")
        expect(page.locator("input[name=reason_code][value=tone]")).to_be_checked()
        page.keyboard.press("Enter")
        expect(page.get_by_test_id("outcome")).to_have_text("Rejected")
        # The next draft for the owner is the third: the second is the colleague's.
        expect(page.get_by_test_id(f"review-card-{third}")).to_be_visible()
        assert Event.objects.rejections().get().data["reason_code"] == "tone"

        # u undoes it: the draft is back, on the owner's card.
        page.locator("#focus").click(position={"x": 1, "y": 1})
        page.keyboard.press("u")
        expect(page.get_by_test_id("undone")).to_be_visible()
        expect(page.get_by_test_id(f"review-card-{first}")).to_be_visible()
        assert Item.objects.get(pk=first).state == ItemState.AWAITING_REVIEW
        assert not Event.objects.rejections().exists()

        # The colleague approves theirs on the phone; the owner's held draft was never theirs.
        phone.get_by_test_id(f"review-card-{second}").get_by_role("button", name="Approve").click()
        expect(phone.get_by_test_id("outcome")).to_have_text("Approved — being applied")
        expect(phone.get_by_test_id(f"review-card-{third}")).to_be_visible()  # free again: the owner moved on
        assert Item.objects.get(pk=second).state == ItemState.APPROVED
        assert ReviewClaim.objects.get(reviewer=owner).item_id == first
    finally:
        phone.context.close()
