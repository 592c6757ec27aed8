"""An item whose draft's text expired (SPEC §11), in a real browser at a phone's 390 px: the page
says when, and is no wider than the screen."""

import pytest
from django.urls import reverse

from ledger.actions.reviewing import reject_version
from tests.factories import ItemFactory, UserFactory, add_version
from tests.review.browser import log_in
from tests.review.test_narrow_screens import OVERFLOWING, PHONE
from tests.review.test_retention_screens import SECRET_DRAFT, expired

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_expired_draft_on_a_phone(page, live_server):
    owner = UserFactory(username="retention-owner", roles=["catalogue_owner"])
    item = ItemFactory(awaiting_review=True)
    draft = add_version(item, SECRET_DRAFT)
    reject_version(item_id=item.pk, version_id=draft.pk, reviewer=owner, reason="Too bland")
    expired(draft)
    page.set_viewport_size(PHONE)

    log_in(page, live_server, owner, then=reverse("item_detail", args=[item.pk]))

    notice = page.get_by_test_id(f"content-expired-{draft.number}")
    assert notice.is_visible() and notice.inner_text().startswith("Content expired on")
    assert SECRET_DRAFT not in page.content()
    assert page.evaluate(OVERFLOWING) == []
