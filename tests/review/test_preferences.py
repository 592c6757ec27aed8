"""Each person's preferences (issue 18, point 8): the time zone every time is shown in, and the review
desk's single-key shortcuts."""

from datetime import UTC, datetime

import pytest
from django.urls import reverse

from ledger.models import Job
from review.models import Preferences
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

CREATED = datetime(2026, 12, 3, 7, 14, tzinfo=UTC)


@pytest.fixture
def job() -> Job:
    job = JobFactory(reference="winter-lamps")
    Job.objects.filter(pk=job.pk).update(created_at=CREATED)
    return job


def test_times_are_in_utc_and_say_so_until_a_person_chooses_a_zone(client, owner, job):
    client.force_login(owner)
    page = client.get(reverse("job_list")).content.decode()
    assert '<time datetime="2026-12-03T07:14:00+00:00">2026-12-03 07:14 UTC</time>' in page
    assert not Preferences.objects.filter(user=owner).exists()


def test_a_chosen_zone_shows_every_time_in_it_and_names_it(client, owner, job):
    client.force_login(owner)
    response = client.post(reverse("preferences"), {"time_zone": "Europe/Paris", "keyboard_shortcuts": "on"})
    assert response.status_code == 302 and response.url == reverse("preferences")
    assert Preferences.objects.get(user=owner).time_zone == "Europe/Paris"

    page = client.get(reverse("job_list")).content.decode()
    assert '<time datetime="2026-12-03T08:14:00+01:00">2026-12-03 08:14 CET</time>' in page
    assert "07:14" not in page


def test_one_persons_zone_is_not_anothers(client, owner, operator, job):
    Preferences.objects.create(user=owner, time_zone="Asia/Tokyo")
    client.force_login(operator)
    assert "2026-12-03 07:14 UTC" in client.get(reverse("job_list")).content.decode()
    client.force_login(owner)
    assert "2026-12-03 16:14 JST" in client.get(reverse("job_list")).content.decode()


def test_an_unknown_zone_is_refused_and_nothing_is_saved(client, owner):
    Preferences.objects.create(user=owner, time_zone="Europe/Lisbon")
    client.force_login(owner)
    response = client.post(reverse("preferences"), {"time_zone": "Mars/Olympus_Mons"})
    assert response.status_code == 400
    assert "Nothing was saved" in response.content.decode()
    assert Preferences.objects.get(user=owner).time_zone == "Europe/Lisbon"


@pytest.mark.parametrize("zone", ["localtime", "Factory"])
def test_a_name_that_is_no_places_zone_is_not_offered(client, owner, zone):
    """ "localtime" is the server's own zone, easily taken for the viewer's local time; "Factory"
    shows every time as "-00". Neither is offered, and neither is saved when sent."""
    client.force_login(owner)
    assert f'value="{zone}"' not in client.get(reverse("preferences")).content.decode()
    response = client.post(reverse("preferences"), {"time_zone": zone, "keyboard_shortcuts": "on"})
    assert response.status_code == 400
    assert not Preferences.objects.filter(user=owner).exists()


def test_shortcuts_are_on_until_turned_off_and_the_page_says_which(client, owner):
    client.force_login(owner)
    desk = reverse("review_queue")
    assert 'data-shortcuts="on"' in client.get(desk).content.decode()
    client.post(reverse("preferences"), {"time_zone": "UTC"})  # the box unticked
    assert Preferences.objects.get(user=owner).keyboard_shortcuts is False
    page = client.get(desk).content.decode()
    assert 'data-shortcuts="off"' in page
    assert "Single-key shortcuts are off" in page
