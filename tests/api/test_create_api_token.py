from datetime import timedelta

import pytest
from django.core.management import CommandError, ManagementUtility, call_command
from django.utils import timezone

from ledger.management.commands.create_api_token import new_token
from ledger.models import ApiToken
from tests.api.conftest import ApiClient, assert_error
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


# --- expiry and revocation -----------------------------------------------------------------


def create_token(capsys, *args) -> str:
    call_command("create_api_token", *args)
    return capsys.readouterr().out.strip()


def test_a_token_with_an_expiry_works_until_it_expires(capsys):
    UserFactory(username="reviewer", roles=["catalogue_owner"])
    token = create_token(capsys, "reviewer", "--expires-days", "30")
    stored = ApiToken.objects.get()
    assert (
        timedelta(days=30) - timedelta(minutes=1) < stored.expires_at - timezone.now() <= timedelta(days=30)
    )
    assert ApiClient(token).get("/api/jobs").status_code == 200
    ApiToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert_error(ApiClient(token).get("/api/jobs"), 401, "unauthenticated")


def test_a_token_without_an_expiry_never_expires(capsys):
    UserFactory(username="reviewer")
    create_token(capsys, "reviewer")
    assert ApiToken.objects.get().expires_at is None


@pytest.mark.parametrize("days", ["0", "-3", "soon", "1.5"])
def test_a_meaningless_expiry_is_refused(days):
    UserFactory(username="reviewer")
    with pytest.raises(CommandError, match="--expires-days must be a whole number of days, 1 or more"):
        call_command("create_api_token", "reviewer", "--expires-days", days)
    assert not ApiToken.objects.exists()


def test_revoking_by_prefix_stops_that_token_only(capsys):
    UserFactory(username="reviewer", roles=["catalogue_owner"])
    kept, revoked = create_token(capsys, "reviewer"), create_token(capsys, "reviewer")
    call_command("revoke_api_token", revoked[:8])
    assert capsys.readouterr().out.startswith(f"revoked {revoked[:8]}… of reviewer, created ")
    assert ApiToken.objects.get(prefix=revoked[:8]).revoked_at is not None
    assert_error(ApiClient(revoked).get("/api/jobs"), 401, "unauthenticated")
    assert ApiClient(kept).get("/api/jobs").status_code == 200


def test_revoking_by_user_stops_all_their_tokens_and_nobody_elses(capsys):
    UserFactory(username="reviewer", roles=["catalogue_owner"])
    UserFactory(username="other", roles=["catalogue_owner"])
    theirs = [create_token(capsys, "reviewer"), create_token(capsys, "reviewer")]
    someone_elses = create_token(capsys, "other")
    call_command("revoke_api_token", "--user", "reviewer")
    printed = capsys.readouterr().out.splitlines()
    assert sorted(line[:16] for line in printed) == sorted(f"revoked {t[:8]}" for t in theirs)
    for token in theirs:
        assert_error(ApiClient(token).get("/api/jobs"), 401)
    assert ApiClient(someone_elses).get("/api/jobs").status_code == 200
    call_command("revoke_api_token", "--user", "reviewer")
    assert capsys.readouterr().out.strip() == "reviewer has no token left to revoke"


def test_revoking_an_unknown_prefix_or_user_is_a_clear_error(capsys):
    UserFactory(username="reviewer")
    token = create_token(capsys, "reviewer")
    with pytest.raises(CommandError, match="No API token starts with 'nosuchtk'"):
        call_command("revoke_api_token", "nosuchtk")
    with pytest.raises(CommandError, match="No user called 'nobody'"):
        call_command("revoke_api_token", "--user", "nobody")
    call_command("revoke_api_token", token[:8])
    with pytest.raises(CommandError, match="was already revoked"):
        call_command("revoke_api_token", token[:8])


def test_revoke_from_the_command_line_exits_1_with_one_line(capsys):
    with pytest.raises(SystemExit) as stopped:
        ManagementUtility(["manage.py", "revoke_api_token", "nosuchtk"]).execute()
    assert stopped.value.code == 1
    assert capsys.readouterr().err.strip() == "CommandError: No API token starts with 'nosuchtk'"


def test_revoke_needs_a_prefix_or_a_user(capsys):
    with pytest.raises(SystemExit) as stopped:
        ManagementUtility(["manage.py", "revoke_api_token"]).execute()
    assert stopped.value.code != 0
    assert "one of the arguments prefix --user is required" in capsys.readouterr().err


def test_no_token_starts_like_a_command_line_option():
    # One in 64 did, and `revoke_api_token -AbC1234` was then refused as an unknown option.
    assert not any(new_token().startswith("-") for _ in range(2_000))
