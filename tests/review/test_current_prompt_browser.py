"""Making a prompt version current in a real browser, on a phone's 390 px: the page shows what the
version changes from the current one, and "Make current" makes it so."""

import pytest
from django.urls import reverse

from ledger.actions.prompts import create_prompt_version
from ledger.models import CurrentPromptChoice, PromptVersion
from tests.factories import UserFactory
from tests.review.browser import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}


def test_an_owner_reads_the_changes_and_makes_the_version_current_on_a_phone(page, live_server):
    from playwright.sync_api import expect

    v1 = PromptVersion.objects.get(task="product_description", version=1)
    v2 = create_prompt_version(
        task="product_description",
        system_message=v1.system_message,
        template=v1.template
        + "\nMention the material first, in a sentence long enough to pass the edge of a phone.",
        output_schema=v1.output_schema,
        rules={**v1.rules, "max_length": 200},
        max_output_tokens=v1.max_output_tokens,
    )
    owner = UserFactory(roles=["catalogue_owner"])
    page.set_viewport_size(PHONE)
    log_in(page, live_server, owner, then=reverse("prompt_detail", args=[v2.pk]))

    expect(page.get_by_test_id("not-current-badge")).to_be_visible()
    expect(page.get_by_test_id("diff-template").locator("ins")).to_contain_text("Mention the material first")
    expect(page.get_by_test_id("diff-validation-rules").locator("del")).to_contain_text('"max_length": 1200')
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]

    page.get_by_role("button", name="Make product_description v2 current").click()

    expect(page.get_by_test_id("current-badge")).to_be_visible()
    expect(page.get_by_test_id("made-current-by")).to_have_text(owner.username)
    assert page.get_by_test_id("make-current-form").count() == 0
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    choice = CurrentPromptChoice.objects.order_by("-pk").first()
    assert (choice.prompt_version_id, choice.actor_id, choice.replaced_id) == (v2.pk, owner.pk, v1.pk)
