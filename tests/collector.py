"""The collector's pass without a worker: each task it would queue runs here, at once, in order
(for tests that drive the ledger in this process)."""

from django.utils.module_loading import import_string

from ledger import tasks
from ledger.models import Submission
from ledger.states import SubmissionState

# The sends planning queued with the intents it claimed (on commit, which a test's transaction may
# never reach): a worker takes each soon after, here at the start of the next pass.
sends_queued: list[tuple[int, str]] = []


def run_here(func: str, *args):
    newest = Submission.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    done = import_string(func)(*args)
    # Planning (a planning task, or a send planning the next unit) claimed each intent it made for
    # the send it queued.
    planned = Submission.objects.filter(pk__gt=newest, state=SubmissionState.INTENT).exclude(claimed_by="")
    sends_queued.extend(planned.order_by("pk").values_list("pk", "claimed_by"))
    return done


def poll_everything() -> int:
    while sends_queued:
        run_here("ledger.tasks.send_submission", *sends_queued.pop(0))
    return tasks.poll_everything(start=run_here)
