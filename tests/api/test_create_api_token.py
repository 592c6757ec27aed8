import pytest
from django.core.management import CommandError, call_command

from ledger.models import ApiToken
from tests.api.conftest import ApiClient
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_the_token_is_printed_once_and_stored_hashed(capsys):
    person = UserFactory(username="reviewer", roles=["catalogue_owner"])
    call_command("create_api_token", "reviewer")
    token = capsys.readouterr().out.strip()
    stored = ApiToken.objects.get()
    assert stored.user == person and stored.token_hash == ApiToken.hash(token) != token
    assert stored.prefix == token[:8]
    assert len(token) >= 40
    assert ApiClient(token).get("/api/jobs").status_code == 200


def test_an_unknown_user_is_refused():
    with pytest.raises(CommandError, match="nobody"):
        call_command("create_api_token", "nobody")
    assert not ApiToken.objects.exists()
