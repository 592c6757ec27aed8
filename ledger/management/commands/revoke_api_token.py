from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from ledger.models import ApiToken


class Command(BaseCommand):
    help = (
        "Revoke API tokens, by the prefix `create_api_token` printed or all of one user's; they then get 401."
    )

    def add_arguments(self, parser):
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("prefix", nargs="?", help="The token's first 8 characters")
        which.add_argument("--user", metavar="USERNAME", help="Revoke every token of this user")

    def handle(self, *args, **options):
        if options["user"] is not None:
            tokens = self.tokens_of(options["user"])
        else:
            tokens = self.token_with(options["prefix"])
        now = timezone.now()
        for token in tokens:
            # Compare-and-set: a token revoked meanwhile by someone else keeps its first revocation time.
            if ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now):
                self.stdout.write(
                    f"revoked {token.prefix}… of {token.user.get_username()}, created {token.created_at:%Y-%m-%d %H:%M}"
                )

    def tokens_of(self, username: str) -> list[ApiToken]:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user called {username!r}")
        tokens = list(user.api_tokens.filter(revoked_at__isnull=True).select_related("user"))
        if not tokens:
            self.stdout.write(f"{username} has no token left to revoke")
        return tokens

    def token_with(self, prefix: str) -> list[ApiToken]:
        found = list(ApiToken.objects.filter(prefix=prefix).select_related("user"))
        if not found:
            raise CommandError(f"No API token starts with {prefix!r}")
        live = [token for token in found if token.revoked_at is None]
        if not live:
            raise CommandError(f"The token {prefix}… was already revoked")
        if len(live) > 1:
            owners = ", ".join(sorted({token.user.get_username() for token in live}))
            raise CommandError(
                f"{len(live)} tokens start with {prefix!r} (of {owners}); revoke them with --user"
            )
        return live
