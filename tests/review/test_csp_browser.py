"""Every screen under the Content-Security-Policy in a real browser: nothing it blocks, htmx still working."""

import pytest
from django.urls import reverse

from ledger.models import PromptVersion
from tests.review.browser import log_in

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
]


def test_no_screen_breaks_the_content_security_policy(page, live_server, admin_person, item):
    from playwright.sync_api import expect

    blocked: list[str] = []
    page.on(
        "console",
        lambda message: blocked.append(message.text) if "Content Security Policy" in message.text else None,
    )
    screens = [
        reverse("dashboard"),
        reverse("job_list"),
        reverse("job_start"),
        reverse("job_detail", args=[item.job_id]),
        reverse("item_detail", args=[item.pk]),
        reverse("review_queue"),
        reverse("review_queue") + "?mode=list",
        reverse("catalogue"),
        reverse("catalogue_product", args=[item.product.sku]),
        reverse("catalogue_import"),
        reverse("prompts"),
        reverse("prompt_detail", args=[PromptVersion.objects.first().pk]),
        reverse("operations"),
        reverse("quality"),
        reverse("audit"),
        reverse("admin:index"),
        reverse("admin:auth_user_changelist"),
        reverse("admin:auth_user_add"),
    ]
    log_in(page, live_server, admin_person, then=screens[0])
    for screen in screens:
        response = page.goto(live_server.url + screen)
        assert response.status == 200, screen
        assert "script-src 'self'" in response.headers["content-security-policy"]
        if not screen.startswith("/admin/"):
            assert page.evaluate("typeof htmx === 'object' && htmx.config.allowEval === false"), screen
    assert blocked == []

    # htmx still swaps under the policy: the review keys (static/review.js) approve in place.
    page.goto(live_server.url + reverse("review_queue"))
    page.evaluate("window.__samePage = true")
    page.get_by_test_id(f"review-card-{item.pk}").get_by_role("button", name="Approve").click()
    expect(page.get_by_test_id(f"review-card-{item.pk}").get_by_test_id("outcome")).to_contain_text(
        "Approved"
    )
    assert page.evaluate("window.__samePage") is True
    assert blocked == []
