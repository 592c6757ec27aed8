"""Every route under /api/, `/metrics` and the providers' `/hooks/*` passes the one door
(review/api/doors.py): the walk finds each route through Django's resolver, checks the door marked
its view, and knocks on it: a stranger, a wrong method and a person without a role get the door's
JSON answers. A route added without the door fails here."""

import re

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from ledger.notices.provider_hooks import SECRET_ENV
from review.api import errors
from review.api.doors import (
    ANYONE,
    BEARER_TOKEN,
    NO_ROLE,
    TOKEN_OR_SESSION,
    Door,
    ProviderSignature,
    door,
)
from review.permissions import VIEWERS
from tests.api.conftest import ApiClient, assert_error

pytestmark = pytest.mark.django_db

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# The routes outside /api/ that stand behind the same door.
BESIDE_THE_API = ("metrics", "hooks/openai", "hooks/gemini")


def api_resolver() -> URLResolver:
    [found] = [
        entry
        for entry in get_resolver().url_patterns
        if isinstance(entry, URLResolver) and str(entry.pattern) == "api/"
    ]
    return found


def routes() -> list[tuple[str, URLPattern]]:
    """(an address that matches it, the route) for every route under /api/ and beside it."""
    found = [("/api/" + str(entry.pattern), entry) for entry in api_resolver().url_patterns]
    found += [
        ("/" + str(entry.pattern), entry)
        for entry in get_resolver().url_patterns
        if isinstance(entry, URLPattern) and str(entry.pattern) in BESIDE_THE_API
    ]
    return found


def address(route: str) -> str:
    """The route with each parameter filled in with something that names nothing."""
    return re.sub(r"<str:\w+>", "NOTHING-1", re.sub(r"<id:\w+>", "987654321", route))


GUARDED = [(address(route), entry) for route, entry in routes() if entry.callback is not errors.unknown]


def test_the_walk_finds_every_route():
    names = {entry.name for _, entry in GUARDED}
    assert {"jobs", "job", "job_stream", "job_export", "job_notifications", "pilot_report", "health"} <= names
    assert {"approve", "reject", "retry", "product", "withdraw", "prompt_current", "cancel_job"} <= names
    assert {"metrics", "openai_hook", "gemini_hook"} <= names
    assert len(GUARDED) == len(api_resolver().url_patterns) - 1 + len(BESIDE_THE_API)


def every_route(resolver: URLResolver | None = None, prefix: str = ""):
    """(route, entry) for every route of the whole site, the admin's included."""
    for entry in (resolver or get_resolver()).url_patterns:
        if isinstance(entry, URLResolver):
            yield from every_route(entry, prefix + str(entry.pattern))
        else:
            yield prefix + str(entry.pattern), entry


def test_no_route_skips_the_csrf_check_without_the_door():
    """A view exempt from Django's CSRF check answers a caller without a session's token: anywhere
    on the site, only the door may let one in. The two others: the API's catch-all, which answers
    404 to anything, and the catalogue upload, which checks the token itself once the file is read."""
    open_doors = {
        route
        for route, entry in every_route()
        if getattr(entry.callback, "csrf_exempt", False) and not hasattr(entry.callback, "door")
    }
    assert open_doors == {"api/^.*$", "catalogue/import"}


@pytest.mark.parametrize(("path", "entry"), GUARDED, ids=[entry.name for _, entry in GUARDED])
def test_every_route_is_marked_by_the_door(path, entry):
    assert isinstance(getattr(entry.callback, "door", None), Door), path
    assert entry.callback.csrf_exempt  # a JSON answer, never the CSRF page


@pytest.fixture
def hooked(monkeypatch):
    for name in SECRET_ENV.values():
        monkeypatch.setenv(name, SECRET)


@pytest.mark.parametrize(("path", "entry"), GUARDED, ids=[entry.name for _, entry in GUARDED])
def test_a_wrong_method_gets_the_doors_405(path, entry, hooked):
    the_door = entry.callback.door
    listed = list(the_door.roles_by_method)
    wrong = next(method for method in METHODS if method not in listed)
    response = Client().generic(wrong, path)
    assert_error(response, 405, "method_not_allowed")
    assert response["Allow"] == ", ".join(listed)


@pytest.mark.parametrize(("path", "entry"), GUARDED, ids=[entry.name for _, entry in GUARDED])
def test_a_stranger_gets_the_doors_answer(path, entry, client, outsider, api_as):
    the_door = entry.callback.door
    for method in the_door.roles_by_method:
        knock = client.generic(method, path, "{}", content_type="application/json")
        if the_door.callers is ANYONE:
            assert knock.status_code not in (401, 403, 405), (path, method)
        elif isinstance(the_door.callers, ProviderSignature):
            # Its secret unset here: the hook is not there at all.
            assert_error(knock, 404, "not_found")
        else:
            assert_error(knock, 401, "unauthenticated")
            assert knock["WWW-Authenticate"].startswith("Bearer")
            # A token of a person without a role: the door's 403, whatever the method.
            assert_error(api_as(outsider).generic(method, path), 403, "forbidden")


@pytest.mark.parametrize(("path", "entry"), GUARDED, ids=[entry.name for _, entry in GUARDED])
def test_a_session_opens_only_the_doors_that_take_one(path, entry, client, outsider):
    the_door = entry.callback.door
    if the_door.callers not in (BEARER_TOKEN, TOKEN_OR_SESSION):
        return
    client.force_login(outsider)
    method = next(iter(the_door.roles_by_method))
    if the_door.callers is TOKEN_OR_SESSION:
        assert_error(client.generic(method, path), 403, "forbidden")
    else:
        assert_error(client.generic(method, path), 401, "unauthenticated")


def test_an_unsigned_webhook_gets_the_doors_400(client, hooked):
    for path in ("/hooks/openai", "/hooks/gemini"):
        assert_error(client.post(path, b"{}", content_type="application/json"), 400, "bad_signature")


@pytest.mark.parametrize("method", METHODS)
def test_an_address_with_nothing_behind_it_is_a_json_404_for_anyone(method, as_owner):
    assert_error(Client().generic(method, "/api/nothing/here"), 404, "not_found")
    assert_error(as_owner.generic(method, "/api/nothing/here"), 404, "not_found")


def test_a_door_refuses_to_be_built_wrong():
    with pytest.raises(ImproperlyConfigured):
        door(BEARER_TOKEN, GET=NO_ROLE)  # a person with no role asked of them
    with pytest.raises(ImproperlyConfigured):
        door(ANYONE, GET=VIEWERS)  # a role asked of no one
    with pytest.raises(ImproperlyConfigured):
        door(TOKEN_OR_SESSION, POST=VIEWERS)  # a session writing past CSRF
    with pytest.raises(ImproperlyConfigured):
        door(ProviderSignature("openai"), POST=VIEWERS)


def test_the_token_is_read_by_the_door_not_the_session(client, owner):
    """Through a door that takes a session too, a bad token is refused whatever the cookies say."""
    client.force_login(owner)
    response = client.get("/api/jobs/987654321/stream", headers={"Authorization": "Bearer nothing"})
    assert_error(response, 401, "unauthenticated")
    assert_error(ApiClient(None).get("/api/jobs"), 401, "unauthenticated")
