"""The pilot screen's go / no-go form (SPEC §8, issue 27 point 3): only catalogue owners and admins
decide, with CSRF; a bad form decides nothing; the report then shows the decision."""

import pytest
from django.test import Client
from django.urls import reverse

from ledger.models import Job, PilotDecision
from tests.pilots import known_pilot

pytestmark = pytest.mark.django_db


def test_the_form_says_what_go_will_start(client, owner):
    pilot_job = known_pilot(owner)
    client.force_login(owner)

    page = client.get(reverse("pilot_report", args=[pilot_job.pk])).content.decode()

    assert 'data-testid="decision-form"' in page
    assert "over <strong>10 products</strong>" in page
    assert "leaving out 2 whose pilot draft was approved" in page


def test_no_go_on_the_screen_records_it_and_starts_nothing(client, owner):
    pilot_job = known_pilot(owner)
    client.force_login(owner)
    jobs = Job.objects.count()

    response = client.post(
        reverse("pilot_decision", args=[pilot_job.pk]), {"decision": "no_go", "note": "Garden fails"}
    )

    assert response.status_code == 302
    assert response["Location"] == reverse("pilot_report", args=[pilot_job.pk])
    assert Job.objects.count() == jobs
    page = client.get(response["Location"]).content.decode()
    assert "No-go: start nothing" in page and "Garden fails" in page
    assert 'data-testid="decision-form"' not in page


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"decision": "perhaps"},
        {"decision": "go", "budget": "0.001"},
        {"decision": "go", "note": "x" * 2001},
    ],
)
def test_a_bad_form_decides_nothing(client, owner, data):
    pilot_job = known_pilot(owner)
    client.force_login(owner)

    response = client.post(reverse("pilot_decision", args=[pilot_job.pk]), data, follow=True)

    assert "Nothing was decided" in response.content.decode()
    assert not PilotDecision.objects.exists()


def test_operators_see_no_form_and_may_not_decide(client, owner, operator):
    pilot_job = known_pilot(owner)
    client.force_login(operator)

    page = client.get(reverse("pilot_report", args=[pilot_job.pk])).content.decode()
    response = client.post(reverse("pilot_decision", args=[pilot_job.pk]), {"decision": "go"})

    assert 'data-testid="decision-form"' not in page
    assert response.status_code == 403
    assert not PilotDecision.objects.exists()


def test_deciding_needs_the_csrf_token(owner):
    pilot_job = known_pilot(owner)
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)

    response = client.post(reverse("pilot_decision", args=[pilot_job.pk]), {"decision": "go"})

    assert response.status_code == 403
    assert not PilotDecision.objects.exists()
