"""Signing in and passwords: the password rules and who reaches user management."""

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


# --- password rules ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("password", "reason"),
    [
        ("pw", "too short"),
        ("password123", "too common"),
        ("83749201573", "entirely numeric"),
        ("person-remington", "too similar to the username"),
    ],
)
def test_the_admin_refuses_a_weak_password(client, password, reason):
    client.force_login(UserFactory(is_superuser=True, is_staff=True))
    person = UserFactory(username="person-remington")
    url = reverse("admin:auth_user_password_change", args=[person.pk])
    response = client.post(url, {"password1": password, "password2": password})
    assert response.status_code == 200
    assert reason in response.content.decode()
    person.refresh_from_db()
    assert person.check_password("pw")


def test_the_admin_accepts_a_strong_password(client):
    client.force_login(UserFactory(is_superuser=True, is_staff=True))
    person = UserFactory()
    url = reverse("admin:auth_user_password_change", args=[person.pk])
    response = client.post(url, {"password1": "lantern-orchard-47", "password2": "lantern-orchard-47"})
    assert response.status_code == 302
    person.refresh_from_db()
    assert person.check_password("lantern-orchard-47")


def test_changing_ones_own_password_follows_the_same_rules(client):
    person = UserFactory()
    client.force_login(person)
    weak = {"old_password": "pw", "new_password1": "12345678", "new_password2": "12345678"}
    response = client.post(reverse("password_change"), weak)
    assert response.status_code == 200
    assert "entirely numeric" in response.content.decode()
    assert User.objects.get(pk=person.pk).check_password("pw")
