from django.core.management.base import BaseCommand, CommandError

from ledger.lifecycle.retention import Unusable, apply_retention, erasable_counts, retain_unusable_days
from ledger.notices.provider_hooks import HINTS_KEPT, forget_old_hints


class Command(BaseCommand):
    help = (
        "Erase now the text of unusable drafts older than BATCHDESK_RETAIN_UNUSABLE_DAYS (SPEC §11), "
        "what the daily scheduled pass does, and print what was erased by kind; it also forgets the "
        "providers' webhook ids older than a week. Safe beside workers "
        "and beside the scheduled pass: a draft is erased, and its event written, once."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--dry-run", action="store_true", help="Print what would be erased now, and change nothing"
        )

    def handle(self, *args, dry_run: bool = False, **options):
        try:
            days = retain_unusable_days()
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if dry_run:
            counts = erasable_counts()
            self.stdout.write(
                f"Would erase the text of {sum(counts.values())} unusable drafts older than {days} days:"
            )
        else:
            done = apply_retention()
            counts = done.erased
            self.stdout.write(
                f"Erased the text of {done.drafts} unusable drafts older than {days} days, "
                f"of {done.items} items:"
            )
        for kind in Unusable:
            self.stdout.write(f"  {kind.label}: {counts.get(kind.value, 0)}")
        if not dry_run:
            forgotten = forget_old_hints()
            self.stdout.write(
                f"Forgot {forgotten} provider webhook ids received more than {HINTS_KEPT.days} days ago"
            )
