import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from ledger.models import ApiToken


class Command(BaseCommand):
    help = "Create a bearer token for /api/ and print it once; only its hash is stored."

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, **options):
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"No user called {options['username']!r}")
        if not user.is_active:
            raise CommandError(f"{user.get_username()} is not active; a token would not work")
        token = secrets.token_urlsafe(32)
        ApiToken.objects.create(user=user, token_hash=ApiToken.hash(token), prefix=token[:8])
        self.stdout.write(token)
