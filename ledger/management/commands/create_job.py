from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from ledger.actions.core import NotAllowed
from ledger.actions.jobs import create_job
from ledger.models import DEFAULT_DESTINATION


class Command(BaseCommand):
    help = "Start a job: freeze the products' current revisions as items and queue their submission."

    def add_arguments(self, parser):
        parser.add_argument("--reference", required=True)
        parser.add_argument("--task", required=True)
        parser.add_argument("--provider", required=True)
        parser.add_argument("--model", help="default: the provider's default model")
        parser.add_argument("--prompt-version", type=int)
        parser.add_argument("--destination", default=DEFAULT_DESTINATION)
        parser.add_argument("--skus", help="comma-separated; default every active product")
        parser.add_argument(
            "--unit-size",
            type=int,
            help="requests per provider batch; default 500 within the provider's limit",
        )
        parser.add_argument("--owner", default="", help="username; default the first superuser")

    def handle(self, *args, **options):
        users = get_user_model().objects
        owner = (
            users.filter(username=options["owner"]).first()
            if options["owner"]
            else users.filter(is_superuser=True).order_by("id").first()
        )
        if owner is None:
            raise CommandError("No owner: pass --owner USERNAME (or create a superuser)")
        skus = [s.strip() for s in options["skus"].split(",") if s.strip()] if options["skus"] else None
        try:
            job = create_job(
                reference=options["reference"],
                owner=owner,
                task=options["task"],
                provider=options["provider"],
                model=options["model"],
                prompt_version=options["prompt_version"],
                destination=options["destination"],
                skus=skus,
                unit_size=options["unit_size"],
            )
        except NotAllowed as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(str(job.pk))
