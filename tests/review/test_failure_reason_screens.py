"""A draft that failed says why on every screen that shows it (SPEC rule 19): the issue's case, a
description of about 20,000 characters from the model, reads "too long" with its length and the
limit on the item page, in the API's `validation` and beside the item on operations, grouped under
its code's words; never a quote of the draft cut before its cause."""

import json
import re

import pytest
from django.test import Client

from ledger.actions.prompts import create_prompt_version
from ledger.bootstrap import DEFAULT_PROMPT
from ledger.models import GeneratedVersion, Item
from ledger.states import ItemState, ReasonCode
from review.operations import attention_groups
from tests.api.conftest import ApiClient, token_for
from tests.collector import poll_everything
from tests.factories import JobFactory, ProductFactory
from tests.provider_emulators import PROVIDERS, serving

pytestmark = pytest.mark.django_db

CAUSE = re.compile(r"Too long: description is (\d{2},\d{3}) characters, the limit is 1,200")


@pytest.fixture
def emulator(settings, monkeypatch):
    with serving(PROVIDERS[0], settings, monkeypatch, seed=5) as running:
        yield running


@pytest.fixture
def too_long(emulator) -> Item:
    """An item of the default prompt (with room for a long answer) whose product's one fact runs to
    20,000 characters: the model writes it into its description, far past the schema's maxLength
    (which strict mode is not sent)."""
    made = {name: value for name, value in DEFAULT_PROMPT.items() if name != "version"}
    prompt = create_prompt_version(**{**made, "task": "long_answers", "max_output_tokens": 20_000})
    job = JobFactory(task=prompt.task, prompt_version=prompt)
    product = ProductFactory(revision__fields={"material": "solid oak " * 2_000})
    item = Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    for _ in range(200):
        poll_everything()
        item.refresh_from_db()
        if item.state == ItemState.VALIDATION_FAILED:
            return item
    raise AssertionError(f"the item is {item.state}: {item.reason}")


def test_the_reason_says_too_long_with_the_length_and_the_limit_everywhere(too_long, operator):
    [version] = GeneratedVersion.objects.filter(item=too_long)
    [reason] = version.validation_reasons
    match = CAUSE.fullmatch(reason)
    described = json.loads(version.content)["description"]
    assert match and int(match[1].replace(",", "")) == len(described) > 20_000
    assert (too_long.reason, too_long.reason_code) == (reason, ReasonCode.TOO_LONG)
    [failed] = too_long.events.filter(to_state=ItemState.VALIDATION_FAILED)
    assert (failed.reason, failed.data) == (reason, {"codes": [ReasonCode.TOO_LONG]})

    api = ApiClient(token_for(operator)).get(f"/api/items/{too_long.pk}").json()
    assert api["reason"] == reason
    assert api["versions"][0]["validation"] == {"valid": False, "reasons": [reason], "notes": []}

    screens = Client()
    screens.force_login(operator)
    page = screens.get(f"/items/{too_long.pk}/").content.decode()
    assert page.count(reason) >= 2  # the item's reason, and its draft's
    # Operations groups it by its code, in the code's words, and lists the item with its reason.
    [group] = [g for g in attention_groups() if g.state == ItemState.VALIDATION_FAILED]
    assert group.label == ReasonCode.TOO_LONG.label
    operations = screens.get("/operations/", {"group": group.key}).content.decode()
    assert reason in operations
