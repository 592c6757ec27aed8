"""API clients for people in each role, each carrying its own bearer token."""

import json
import secrets

import pytest
from django.test import Client

from ledger.models import ApiToken


class ApiClient(Client):
    """Django's test client, sending JSON and a bearer token with every request."""

    def __init__(self, token: str | None, **kwargs):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        super().__init__(headers=headers, **kwargs)

    def post_json(self, path: str, body=None, **kwargs):
        data = body if isinstance(body, str | bytes) else json.dumps(body if body is not None else {})
        return self.post(path, data, content_type="application/json", **kwargs)

    def put_json(self, path: str, body, **kwargs):
        data = body if isinstance(body, str | bytes) else json.dumps(body)
        return self.put(path, data, content_type="application/json", **kwargs)


def token_for(user) -> str:
    token = secrets.token_urlsafe(32)
    ApiToken.objects.create(user=user, token_hash=ApiToken.hash(token), prefix=token[:8])
    return token


@pytest.fixture
def api_as():
    """`api_as(user)`: a client acting as `user`."""
    return lambda user: ApiClient(token_for(user))


@pytest.fixture
def as_owner(api_as, owner):
    return api_as(owner)


@pytest.fixture
def as_operator(api_as, operator):
    return api_as(operator)


@pytest.fixture
def as_outsider(api_as, outsider):
    return api_as(outsider)


def assert_error(response, status: int, code: str | None = None, fields: set[str] | None = None) -> dict:
    """The response is an error in the API's format; returns its `error`."""
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"code", "message", "fields"}
    assert error["message"]
    if code is not None:
        assert error["code"] == code
    if fields is not None:
        assert set(error["fields"]) == fields
    return error
