import math
import time

from django.core.management.base import BaseCommand, CommandError

from ledger.actions.collecting import collect_submission
from ledger.models import Submission


class Command(BaseCommand):
    help = (
        "Collect an ended submission now, in this process and without a time limit: what a worker's "
        "collection task does (safe beside workers: the submission is claimed, and what is recorded "
        "is never recorded twice)."
    )

    def add_arguments(self, parser):
        parser.add_argument("submission_id", type=int)

    def handle(self, *args, submission_id: int, **options):
        submission = Submission.objects.filter(pk=submission_id).first()
        if submission is None:
            raise CommandError(f"No submission {submission_id}")
        started = time.perf_counter()
        outcome = collect_submission(submission_id, seconds=math.inf)
        entries = submission.entries.count()
        self.stdout.write(f"{outcome}: {entries} requests in {time.perf_counter() - started:.2f} s")
        if outcome != "collected":
            submission.refresh_from_db()
            raise CommandError(f"Submission {submission_id} is {submission.state}: {outcome}")
