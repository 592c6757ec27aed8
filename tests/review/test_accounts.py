"""Signing in and passwords: the password rules and who reaches user management."""

from datetime import timedelta
from io import StringIO

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

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


# --- login throttling ----------------------------------------------------------------------

LIMIT = settings.AXES_FAILURE_LIMIT
ADDRESS_LIMIT = settings.BATCHDESK_LOGIN_ADDRESS_FAILURE_LIMIT


def log_in(client, username: str, password: str, address: str, forwarded_for: str | None = None):
    extra = {"REMOTE_ADDR": address}
    if forwarded_for:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded_for
    return client.post(reverse("login"), {"username": username, "password": password}, **extra)


def is_logged_in(client) -> bool:
    return "_auth_user_id" in client.session


def test_a_few_mistakes_do_not_lock_anyone_out(client):
    UserFactory(username="alice")
    for _ in range(LIMIT - 1):
        assert log_in(client, "alice", "nope", "10.0.0.1").status_code == 200
    assert log_in(client, "alice", "pw", "10.0.0.1").status_code == 302
    assert is_logged_in(client)


def test_failures_for_one_user_name_lock_it_from_every_address(client):
    UserFactory(username="alice")
    for n in range(LIMIT - 1):
        assert log_in(client, "alice", "nope", f"10.0.0.{n + 1}").status_code == 200
    assert log_in(client, "alice", "nope", "10.0.0.99").status_code == 429
    refused = log_in(client, "alice", "pw", "10.0.9.9")
    assert refused.status_code == 429
    html = " ".join(refused.content.decode().split())
    assert "Too many failed log-ins" in html
    assert f"Logging in as “alice” is paused: there were {LIMIT} failed log-ins for this user name." in html
    assert "Try again in 15 minutes" in html
    assert not is_logged_in(client)
    # Someone else, from yet another address, is not affected.
    UserFactory(username="bob")
    assert log_in(client, "bob", "pw", "10.0.8.8").status_code == 302


def test_one_persons_failures_behind_an_office_address_lock_nobody_else(client):
    """Everyone in the office reaches the server from 192.0.2.10 (a NAT): alice forgets her password."""
    UserFactory(username="alice")
    UserFactory(username="bob")
    for _ in range(LIMIT):
        log_in(client, "alice", "nope", "192.0.2.10")
    assert log_in(client, "alice", "pw", "192.0.2.10").status_code == 429
    # The same (user name, address) pair stays locked; the office does not.
    response = log_in(client, "bob", "pw", "192.0.2.10")
    assert response.status_code == 302
    assert is_logged_in(client)


def test_an_address_alone_is_locked_only_at_its_own_much_higher_count(client):
    UserFactory(username="bob")
    assert ADDRESS_LIMIT >= 10 * LIMIT
    for n in range(ADDRESS_LIMIT - 1):
        # Each name fewer times than its own limit: only the address's count grows to its limit.
        assert log_in(client, f"guess{n // (LIMIT - 1)}", "nope", "10.0.0.7").status_code == 200
    last = log_in(client, "one-more-guess", "nope", "10.0.0.7")
    assert last.status_code == 429
    refused = log_in(client, "bob", "pw", "10.0.0.7")
    assert refused.status_code == 429
    html = " ".join(refused.content.decode().split())
    assert f"Logging in from this address is paused: {ADDRESS_LIMIT} failed log-ins came from it" in html
    assert not is_logged_in(client)
    assert log_in(client, "bob", "pw", "10.0.0.8").status_code == 302


@pytest.mark.parametrize("login_url", ["login", "admin:login"])
def test_a_user_name_longer_than_any_is_a_failed_log_in_not_an_error(client, login_url):
    """A user name of 5,000 characters (the forms check no length before authenticating) is counted
    as a failed log-in under its first 255 characters, the column django-axes records it in."""
    name = "x" * 5000
    response = client.post(reverse(login_url), {"username": name, "password": "nope"}, REMOTE_ADDR="10.0.0.3")
    assert response.status_code == 200
    assert "correct" in response.content.decode()  # "Please enter a correct username and password"
    assert AccessAttempt.objects.get().username == name[:255]
    assert not is_logged_in(client)


def tries_left(response) -> str:
    html = " ".join(response.content.decode().split())
    return html.split('data-testid="tries-left">', 1)[1].split("</li>", 1)[0]


def test_the_login_page_says_how_many_tries_are_left(client):
    UserFactory(username="alice")
    first = log_in(client, "alice", "nope", "10.0.0.1")
    assert "Please enter a correct username and password" in first.content.decode()
    assert (
        tries_left(first)
        == f"{LIMIT - 1} tries left for this user name before logging in pauses for 15 minutes."
    )
    for _ in range(LIMIT - 3):
        log_in(client, "alice", "nope", "10.0.0.2")
    assert tries_left(log_in(client, "alice", "nope", "10.0.0.3")).startswith("1 try left for this user name")
    # A page that was not a failed try says nothing about tries.
    assert 'data-testid="tries-left"' not in client.get(reverse("login")).content.decode()


def test_the_login_page_counts_the_address_when_it_is_nearer_its_limit(client):
    UserFactory(username="bob")
    for n in range(ADDRESS_LIMIT - 3):
        log_in(client, f"guess{n // (LIMIT - 1)}", "nope", "10.0.0.7")
    response = log_in(client, "bob", "nope", "10.0.0.7")
    assert tries_left(response).startswith("2 tries left from this address before logging in pauses")


def test_axes_reset_lifts_every_lock(client):
    UserFactory(username="alice")
    for _ in range(LIMIT):
        log_in(client, "alice", "nope", "10.0.0.1")
    assert log_in(client, "alice", "pw", "10.0.0.1").status_code == 429
    output = StringIO()
    call_command("axes_reset", stdout=output)
    assert "attempts removed" in output.getvalue()
    assert log_in(client, "alice", "pw", "10.0.0.1").status_code == 302


def test_the_lock_lifts_when_the_window_has_passed(client):
    UserFactory(username="alice")
    for _ in range(LIMIT):
        log_in(client, "alice", "nope", "10.0.0.1")
    assert log_in(client, "alice", "pw", "10.0.0.1").status_code == 429
    AccessAttempt.objects.update(
        attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(seconds=1)
    )
    assert log_in(client, "alice", "pw", "10.0.0.1").status_code == 302


def test_the_admin_login_is_throttled_too(client):
    UserFactory(username="root", is_staff=True, is_superuser=True)
    for _ in range(LIMIT):
        client.post(reverse("admin:login"), {"username": "root", "password": "nope"}, REMOTE_ADDR="10.0.0.1")
    response = client.post(
        reverse("admin:login"), {"username": "root", "password": "pw"}, REMOTE_ADDR="10.0.0.2"
    )
    assert response.status_code == 429
    assert not is_logged_in(client)


def test_behind_the_tls_proxy_the_address_is_the_one_the_proxy_saw(client, settings):
    settings.BATCHDESK_HTTPS = True
    UserFactory(username="bob")
    for n in range(ADDRESS_LIMIT):
        # A client cannot choose its address by sending its own X-Forwarded-For: the proxy appends.
        log_in(client, f"guess{n}", "nope", "10.9.9.9", forwarded_for=f"1.2.3.{n % 250}, 203.0.113.5")
    assert log_in(client, "bob", "pw", "10.9.9.9", forwarded_for="203.0.113.5").status_code == 429
    # Everyone else behind the same proxy still logs in.
    assert log_in(client, "bob", "pw", "10.9.9.9", forwarded_for="198.51.100.7").status_code == 302


# --- user management in the admin ----------------------------------------------------------


def test_an_admin_manages_people_without_a_staff_flag(client):
    admin = UserFactory(roles=["admin"], is_staff=False)
    client.force_login(admin)
    assert client.get(reverse("admin:index")).status_code == 200
    assert client.get(reverse("admin:auth_user_changelist")).status_code == 200
    assert client.get(reverse("admin:auth_group_changelist")).status_code == 200
    response = client.post(
        reverse("admin:auth_user_add"),
        {
            "username": "newcomer",
            "usable_password": "true",
            "password1": "lantern-orchard-47",
            "password2": "lantern-orchard-47",
        },
    )
    assert response.status_code == 302
    assert User.objects.get(username="newcomer").check_password("lantern-orchard-47")
    admin.refresh_from_db()
    assert not admin.is_staff


@pytest.mark.parametrize("role", ["catalogue_owner", "operator"])
def test_other_roles_do_not_reach_user_management(client, role):
    client.force_login(UserFactory(roles=[role]))
    response = client.get(reverse("admin:auth_user_changelist"))
    assert response.status_code == 302 and response.url.startswith(reverse("admin:login"))
    # A staff flag set by hand lets them into the admin, but not to people.
    client.force_login(UserFactory(roles=[role], is_staff=True))
    assert client.get(reverse("admin:auth_user_changelist")).status_code == 403
    assert client.post(reverse("admin:auth_user_add"), {"username": "x"}).status_code == 403
    assert not User.objects.filter(username="x").exists()


def test_an_admin_may_log_in_through_the_admins_own_login_page(client):
    UserFactory(username="chief", roles=["admin"], is_staff=False)
    UserFactory(username="worker", roles=["operator"], is_staff=False)
    refused = client.post(reverse("admin:login"), {"username": "worker", "password": "pw"})
    assert refused.status_code == 200 and "for a staff account" in refused.content.decode()
    response = client.post(reverse("admin:login"), {"username": "chief", "password": "pw"})
    assert response.status_code == 302
    assert client.get(reverse("admin:auth_user_changelist")).status_code == 200
