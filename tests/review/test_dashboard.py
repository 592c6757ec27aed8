"""The dashboard leads with what waits for the person looking (issue 18, point 4): drafts to review
for catalogue owners, items waiting for an operator for operators, both for admins, and what the
day's drafts cost so far for everyone."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from ledger.models import GeneratedVersion
from ledger.money.pricing import price_for, priced_spend
from ledger.states import ItemState
from review.display import money_text
from review.jobs import spend_since
from tests.factories import ItemFactory, JobFactory, UserFactory, add_version

pytestmark = pytest.mark.django_db

S = ItemState


@pytest.fixture
def work():
    """Two drafts to review, three items waiting for an operator (a rejected draft is not one)."""
    job = JobFactory()
    for _ in range(2):
        ItemFactory(job=job, awaiting_review=True)
    for state in (S.VALIDATION_FAILED, S.DEAD_LETTER, S.DESTINATION_REJECTED, S.REJECTED, S.APPLIED):
        ItemFactory(job=job, state=state)
    return job


def panel(client, person) -> str:
    client.force_login(person)
    html = client.get(reverse("dashboard")).content.decode()
    assert html.index('data-testid="waiting"') < html.index('data-testid="jobs"')  # it leads
    return html.split('data-testid="waiting"')[1].split("</section>")[0]


def test_a_catalogue_owner_sees_the_drafts_to_review_first(client, owner, work):
    shown = panel(client, owner)
    assert f'<a href="{reverse("review_queue")}"><strong>2</strong> drafts to review</a>' in shown
    assert 'data-testid="items-for-operator"' not in shown


def test_an_operator_sees_the_items_waiting_for_them(client, operator, work):
    shown = panel(client, operator)
    assert f'<a href="{reverse("operations")}"><strong>3</strong> items waiting for an operator</a>' in shown
    assert 'data-testid="drafts-to-review"' not in shown


def test_an_admin_sees_both(client, admin_person, work):
    shown = panel(client, admin_person)
    assert "<strong>2</strong> drafts to review" in shown
    assert "<strong>3</strong> items waiting for an operator" in shown


def test_nothing_waiting_is_said_plainly(client):
    shown = panel(client, UserFactory(roles=["admin"]))
    assert "No draft to review." in shown and "No item waiting for an operator." in shown


def test_spend_today_counts_the_drafts_received_since_midnight(client, owner):
    job = JobFactory(provider="emulator", model="gpt-4o-mini")
    today = [add_version(ItemFactory(job=job, awaiting_review=True)) for _ in range(3)]
    GeneratedVersion.objects.filter(pk__in=[v.pk for v in today]).update(
        input_tokens=400_000, output_tokens=300_000
    )
    yesterday = add_version(ItemFactory(job=job, awaiting_review=True))
    GeneratedVersion.objects.filter(pk=yesterday.pk).update(
        input_tokens=9_000_000,
        output_tokens=9_000_000,
        created_at=timezone.localtime().replace(hour=0, minute=0) - timedelta(minutes=1),
    )
    expected = price_for("emulator", "gpt-4o-mini").cost(1_200_000, 900_000)
    assert expected > Decimal("0.01")

    shown = panel(client, owner)

    spend = shown.split('data-testid="spend-today"')[1].split("</li>")[0]
    assert f">{money_text(expected.quantize(Decimal('0.000001')), 'USD')}<" in spend
    assert "without a known price" not in spend


def test_spend_today_names_what_has_no_price(client, operator):
    job = JobFactory(provider="emulator", model="a-model-nobody-prices")
    add_version(ItemFactory(job=job, awaiting_review=True))
    spend = panel(client, operator).split('data-testid="spend-today"')[1].split("</li>")[0]
    assert f">{money_text(0, 'USD')}<" in spend and "1 model without a known price" in spend


def test_spend_since_a_moment_inside_a_quarter_hour_counts_from_that_moment():
    """The drafts' tallies add up quarter hours; a moment inside one still counts only what came after it."""
    job = JobFactory(provider="emulator", model="gpt-4o-mini")
    drafts = [add_version(ItemFactory(job=job, awaiting_review=True)) for _ in range(4)]
    quarter = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
    for draft, minutes in zip(drafts, (4, 5, 6, 20), strict=True):
        GeneratedVersion.objects.filter(pk=draft.pk).update(created_at=quarter + timedelta(minutes=minutes))

    assert spend_since(quarter + timedelta(minutes=5)) == priced_spend(
        [("emulator", "gpt-4o-mini", 360, 180)]
    )
    assert spend_since(quarter) == priced_spend([("emulator", "gpt-4o-mini", 480, 240)])
    assert spend_since(quarter + timedelta(minutes=21)).total == 0


def test_the_jobs_poll_does_not_count_again(client, owner, work):
    client.force_login(owner)
    partial = client.get(reverse("dashboard"), headers={"HX-Request": "true"}).content.decode()
    assert 'data-testid="jobs"' in partial and 'data-testid="waiting"' not in partial
