import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from ledger.models import ApiToken


def positive_days(text: str) -> int:
    try:
        days = int(text)
    except ValueError:
        days = 0
    if days < 1:
        raise CommandError(f"--expires-days must be a whole number of days, 1 or more (not {text!r})")
    return days


class Command(BaseCommand):
    help = "Create a bearer token for /api/ and print it once; only its hash is stored."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument(
            "--expires-days", type=positive_days, help="The token stops working after this many days"
        )

    def handle(self, *args, **options):
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"No user called {options['username']!r}")
        if not user.is_active:
            raise CommandError(f"{user.get_username()} is not active; a token would not work")
        days = options["expires_days"]
        expires_at = timezone.now() + timedelta(days=days) if days else None
        token = new_token()
        ApiToken.objects.create(
            user=user, token_hash=ApiToken.hash(token), prefix=token[:8], expires_at=expires_at
        )
        self.stdout.write(token)


def new_token() -> str:
    """43 URL-safe characters that never start with "-": its first eight name it on the command line
    (`revoke_api_token PREFIX`), where "-…" would be read as an option (one token in 64 did)."""
    while (token := secrets.token_urlsafe(32)).startswith("-"):
        pass
    return token
