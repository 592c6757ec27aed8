"""Company sign-in (SPEC §8) against a real OpenID provider in a process of its own
(tests/oidc_provider: django-oauth-toolkit, PKCE required), with Django's test client as BatchDesk's
browser and httpx as the provider's; and local passwords turned off (BATCHDESK_LOCAL_LOGIN=0)."""

import json
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx
import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import Group, User
from django.core import checks
from django.urls import reverse

from review.models import CompanyIdentity
from tests.factories import UserFactory
from tests.oidc_provider.running import CLIENT_ID, CLIENT_SECRET, start_provider
from tests.processes import free_port

pytestmark = pytest.mark.django_db

CALLBACK = "http://testserver/oidc/callback/"


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    """One provider for the module (its start takes seconds); each test names people of its own."""
    running = start_provider(tmp_path_factory.mktemp("provider"), CALLBACK)
    yield running
    running.stop()


@pytest.fixture
def directory(provider, settings):
    """The provider, with BatchDesk configured for it as a deployment's environment would."""
    for name, value in provider.batchdesk_settings().items():
        setattr(settings, name, value)
    return provider


def provider_answer(authorize_url: str, username: str, password: str = "pw") -> httpx.Response:
    """What the provider answers a browser sent to `authorize_url` that signs in with its form: a
    redirect back to BatchDesk (or with an error)."""
    with httpx.Client(timeout=10) as browser:
        to_log_in = browser.get(authorize_url)
        assert to_log_in.status_code == 302, to_log_in.text
        form_url = urljoin(authorize_url, to_log_in.headers["location"])
        form = browser.get(form_url)
        assert "Directory sign-in" in form.text
        signed_in = browser.post(
            form_url,
            data={
                "username": username,
                "password": password,
                "csrfmiddlewaretoken": browser.cookies["provider_csrftoken"],
                "next": parse_qs(urlsplit(form_url).query)["next"][0],
            },
        )
        assert signed_in.status_code == 302, signed_in.text
        return browser.get(urljoin(form_url, signed_in.headers["location"]))


def sign_in(client, username: str, password: str = "pw"):
    """The button on BatchDesk's log-in page, the provider's form, and back to BatchDesk's callback."""
    start = client.get(reverse("company_sign_in"))
    assert start.status_code == 302
    answer = provider_answer(start["Location"], username, password)
    assert answer.status_code == 302
    assert answer.headers["location"].startswith(CALLBACK), answer.headers["location"]
    return client.get(answer.headers["location"].removeprefix("http://testserver"))


def roles(user: User) -> set[str]:
    return set(user.groups.values_list("name", flat=True))


def signed_in_person(client) -> User | None:
    pk = client.session.get("_auth_user_id")
    return User.objects.get(pk=pk) if pk else None


# --- unconfigured -----------------------------------------------------------------------------


def test_unconfigured_there_is_no_company_sign_in(client):
    page = client.get(reverse("login"))
    assert page.status_code == 200
    assert 'data-testid="company-sign-in"' not in page.content.decode()
    assert "Sign in with" not in page.content.decode()
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/?code=x&state=y").status_code == 404


# --- the flow against the real provider -----------------------------------------------------


def test_the_first_sign_in_creates_the_person_with_the_role_of_their_group(client, directory):
    directory.person("alice", password="pw", email="alice@acme.test", groups="Catalogue team,Canteen")
    page = client.get(reverse("login") + "?next=/review/")
    html = page.content.decode()
    assert 'data-testid="company-sign-in"' in html
    assert "Sign in with Acme Directory" in html
    assert "/oidc/authenticate/?next=/review/" in html

    landed = sign_in(client, "alice")
    assert landed.status_code == 302
    alice = signed_in_person(client)
    assert alice.username == "alice"
    assert alice.email == "alice@acme.test"
    assert roles(alice) == {"catalogue_owner"}
    assert not alice.has_usable_password()
    assert CompanyIdentity.objects.get(user=alice).issuer == directory.issuer
    assert client.get(reverse("dashboard")).status_code == 200
    # A working day, then the directory is asked again.
    assert client.session.get_expiry_age() == 12 * 3600
    # Her password is the directory's: BatchDesk offers none to change.
    assert "Change your password" not in client.get(reverse("preferences")).content.decode()


def test_pkce_is_sent_and_the_provider_requires_it(client, directory):
    directory.person("pat", password="pw", groups="Catalogue team")
    start = client.get(reverse("company_sign_in"))
    query = parse_qs(urlsplit(start["Location"]).query)
    assert query["code_challenge_method"] == ["S256"]
    assert len(query["code_challenge"][0]) == 43  # base64url of a SHA-256
    assert query["client_id"] == [CLIENT_ID]
    assert query["redirect_uri"] == [CALLBACK]

    # The provider refuses an authorization request without a challenge…
    without = {k: v for k, v in query.items() if not k.startswith("code_challenge")}
    bare = start["Location"].split("?")[0] + "?" + str(httpx.QueryParams(without))
    refused = provider_answer(bare, "pat")
    assert "error=invalid_request" in refused.headers["location"]
    # …and a code issued for a challenge, redeemed without its verifier.
    answer = provider_answer(start["Location"], "pat")
    code = parse_qs(urlsplit(answer.headers["location"]).query)["code"][0]
    token_endpoint = directory.issuer + "/token/"
    no_verifier = httpx.post(
        token_endpoint,
        data={"grant_type": "authorization_code", "code": code, "redirect_uri": CALLBACK},
        auth=(CLIENT_ID, CLIENT_SECRET),
    )
    assert no_verifier.status_code == 400
    assert no_verifier.json()["error"] in {"invalid_request", "invalid_grant"}
    # BatchDesk itself sends the verifier: its sign-ins succeed.
    sign_in(client, "pat")
    assert signed_in_person(client).username == "pat"


def test_roles_follow_the_groups_at_every_sign_in(client, directory):
    directory.person("bob", password="pw", groups="Catalogue team,Operations")
    sign_in(client, "bob")
    bob = signed_in_person(client)
    assert roles(bob) == {"catalogue_owner", "operator"}
    # A group BatchDesk gave by hand that is not a role is not the directory's to take away.
    bob.groups.add(Group.objects.create(name="newsletter"))

    directory.person("bob", groups="Operations")
    client.post(reverse("logout"))
    sign_in(client, "bob")
    assert signed_in_person(client) == bob
    assert roles(bob) == {"operator", "newsletter"}

    directory.person("bob", groups="")
    client.post(reverse("logout"))
    sign_in(client, "bob")
    assert roles(bob) == {"newsletter"}
    # Signed in, but no role: the app's own refusal, not an error.
    assert client.get(reverse("dashboard")).status_code == 403


def test_a_person_renamed_in_the_directory_is_the_same_account(client, directory):
    directory.person("carol", password="pw", groups="IT admins")
    sign_in(client, "carol")
    carol = signed_in_person(client)
    directory.person("carol", rename_to="carol.jones", email="carol.jones@acme.test")
    client.post(reverse("logout"))
    sign_in(client, "carol.jones")
    assert signed_in_person(client) == carol
    carol.refresh_from_db()
    assert carol.username == "carol"  # as the audit has always shown her
    assert carol.email == "carol.jones@acme.test"
    assert User.objects.count() == 1


def test_a_local_account_of_the_same_name_is_never_taken_over(client, directory):
    local = UserFactory(username="dave", roles=["admin"])
    directory.person("dave", password="pw", groups="")
    sign_in(client, "dave")
    signed_in = signed_in_person(client)
    assert signed_in != local
    assert signed_in.username == "dave-2"
    assert roles(signed_in) == set()
    assert roles(local) == {"admin"}


def test_an_account_an_admin_deactivated_cannot_sign_in(client, directory):
    directory.person("erin", password="pw", groups="Catalogue team")
    sign_in(client, "erin")
    erin = signed_in_person(client)
    User.objects.filter(pk=erin.pk).update(is_active=False)
    # Her open session ends at once…
    assert client.get(reverse("dashboard")).status_code == 302
    # …and the directory cannot open another.
    directory.person("erin", groups="Catalogue team,IT admins")
    landed = sign_in(client, "erin")
    assert landed["Location"] == reverse("login")
    assert client.get(reverse("dashboard")).status_code == 302
    assert roles(erin) == {"catalogue_owner"}
    messages = " ".join(client.get(reverse("login")).content.decode().split())
    assert "Signing in with Acme Directory did not complete, and nothing changed here." in messages


def test_a_refused_token_request_fails_with_a_message_and_never_logs_the_secret(
    client, directory, settings, caplog
):
    directory.person("frank", password="pw", groups="Catalogue team")
    settings.BATCHDESK_OIDC_CLIENT_SECRET = "a-wrong-secret-that-must-not-be-logged"
    landed = sign_in(client, "frank")
    assert landed.status_code == 302
    assert landed["Location"] == reverse("login")
    assert signed_in_person(client) is None
    assert not User.objects.filter(username="frank").exists()
    assert "Company sign-in: the provider refused or failed" in caplog.text
    assert "a-wrong-secret-that-must-not-be-logged" not in caplog.text


# --- an issuer that cannot be reached ---------------------------------------------------------


def test_an_issuer_that_cannot_be_reached_stops_nothing(client, settings):
    settings.BATCHDESK_OIDC_ISSUER = f"http://127.0.0.1:{free_port()}/o"
    settings.BATCHDESK_OIDC_CLIENT_ID = CLIENT_ID
    settings.BATCHDESK_OIDC_CLIENT_SECRET = CLIENT_SECRET
    settings.BATCHDESK_OIDC_NAME = "Acme Directory"
    assert [m for m in checks.run_checks() if m.is_serious()] == []
    page = client.get(reverse("login"))
    assert page.status_code == 200
    assert "Sign in with Acme Directory" in page.content.decode()
    start = client.get(reverse("company_sign_in") + "?next=/review/")
    assert start.status_code == 302
    assert start["Location"] == reverse("login") + "?next=%2Freview%2F"
    said = " ".join(client.get(start["Location"]).content.decode().split())
    assert "Signing in with Acme Directory is not possible just now" in said
    # Passwords still work.
    UserFactory(username="gina")
    assert client.post(reverse("login"), {"username": "gina", "password": "pw"}).status_code == 302


# --- settings checks --------------------------------------------------------------------------


def check_ids(**kwargs) -> set[str]:
    return {m.id for m in checks.run_checks(**kwargs) if m.id and m.id.startswith("batchdesk.")}


def test_bad_role_groups_stop_startup(settings):
    settings.BATCHDESK_OIDC_ROLE_GROUPS = "{not json"
    assert "batchdesk.E020" in check_ids()
    settings.BATCHDESK_OIDC_ROLE_GROUPS = json.dumps({"reviewer": ["Everyone"]})
    assert "batchdesk.E020" in check_ids()
    settings.BATCHDESK_OIDC_ROLE_GROUPS = json.dumps({"operator": ["Operations"]})
    assert "batchdesk.E020" not in check_ids()


def test_passwords_off_without_a_company_sign_in_is_warned_of(settings):
    settings.BATCHDESK_LOCAL_LOGIN = False
    assert "batchdesk.W021" in check_ids()
    settings.BATCHDESK_OIDC_ISSUER = "https://login.acme.test/oauth2/default"
    settings.BATCHDESK_OIDC_CLIENT_ID = CLIENT_ID
    settings.BATCHDESK_OIDC_CLIENT_SECRET = CLIENT_SECRET
    assert "batchdesk.W021" not in check_ids()


def test_check_deploy_warns_of_an_issuer_over_plain_http(settings):
    settings.DEBUG = False
    settings.BATCHDESK_OIDC_CLIENT_ID = CLIENT_ID
    settings.BATCHDESK_OIDC_CLIENT_SECRET = CLIENT_SECRET
    settings.BATCHDESK_OIDC_ISSUER = "http://login.acme.test/oauth2/default"
    assert "batchdesk.W020" in check_ids(include_deployment_checks=True)
    settings.BATCHDESK_OIDC_ISSUER = "https://login.acme.test/oauth2/default"
    assert "batchdesk.W020" not in check_ids(include_deployment_checks=True)


# --- local passwords turned off ---------------------------------------------------------------


def log_in(client, url_name: str, username: str):
    return client.post(reverse(url_name), {"username": username, "password": "pw"}, REMOTE_ADDR="10.1.1.1")


def test_with_local_login_off_a_password_opens_only_a_superusers_account(client, settings):
    settings.BATCHDESK_LOCAL_LOGIN = False
    UserFactory(username="owen", roles=["catalogue_owner"])
    UserFactory(username="root", is_superuser=True, is_staff=True)

    page = client.get(reverse("login"))
    assert 'data-testid="local-login-off"' in page.content.decode()
    refused = log_in(client, "login", "owen")
    assert refused.status_code == 200
    said = " ".join(refused.content.decode().split())
    assert "Passwords open only the break-glass administrators" in said
    assert "_auth_user_id" not in client.session
    # A refused password counts as a failed log-in: the throttle still applies.
    assert AccessAttempt.objects.get(username="owen").failures_since_start == 1

    assert log_in(client, "login", "root").status_code == 302
    assert signed_in_person(client).username == "root"


def test_with_local_login_off_the_admin_log_in_is_no_back_door(client, settings):
    settings.BATCHDESK_LOCAL_LOGIN = False
    UserFactory(username="ada", roles=["admin"], is_staff=True)
    UserFactory(username="root", is_superuser=True, is_staff=True)
    refused = log_in(client, "admin:login", "ada")
    assert refused.status_code == 200
    assert "_auth_user_id" not in client.session
    assert log_in(client, "admin:login", "root").status_code == 302
    assert signed_in_person(client).username == "root"


def test_turning_local_login_off_ends_password_sessions_of_everyone_but_superusers(client, settings):
    UserFactory(username="owen", roles=["catalogue_owner"])
    assert log_in(client, "login", "owen").status_code == 302
    assert client.get(reverse("dashboard")).status_code == 200
    settings.BATCHDESK_LOCAL_LOGIN = False
    assert client.get(reverse("dashboard")).status_code == 302


def test_local_login_on_changes_nothing(client):
    UserFactory(username="owen", roles=["catalogue_owner"])
    page = client.get(reverse("login")).content.decode()
    assert "break-glass" not in page
    assert log_in(client, "login", "owen").status_code == 302
    assert "Change your password" in client.get(reverse("preferences")).content.decode()
