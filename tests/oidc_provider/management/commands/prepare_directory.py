from django.core.management import BaseCommand, call_command
from oauth2_provider.models import Application


class Command(BaseCommand):
    help = "Creates the provider's database and registers BatchDesk as a confidential client."

    def add_arguments(self, parser):
        parser.add_argument("--client-id", required=True)
        parser.add_argument("--client-secret", required=True)
        parser.add_argument("--redirect-uri", action="append", required=True)

    def handle(self, *args, client_id, client_secret, redirect_uri, **options):
        call_command("migrate", verbosity=0)
        Application.objects.create(
            name="BatchDesk",
            client_id=client_id,
            client_secret=client_secret,
            client_type=Application.CLIENT_CONFIDENTIAL,
            authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
            redirect_uris=" ".join(redirect_uri),
            algorithm=Application.RS256_ALGORITHM,
            skip_authorization=True,
        )
