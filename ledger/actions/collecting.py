"""Collecting: polling open submissions and recording every result line by custom_id, once
(rules 2 and 4), with failures classified and retried by themselves when transient (rule 8)."""

import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from datetime import timedelta

import psycopg
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import F
from django.utils import timezone

from ..drafts.answers import storable
from ..drafts.scrubbing import SHORTEST_SECRET_ANYWHERE, configured_secrets, scrub_credentials, stored_text
from ..drafts.validation import DraftChecker
from ..lifecycle import deadlines
from ..models import Item, Submission, SubmissionItem
from ..providers import capabilities, get_provider, schema_dialect
from ..providers.base import Delivery, ProviderError, ResultLine
from ..retrying import PERMANENT_REFUSAL_PATIENCE
from ..states import ItemState, ReasonCode, SubmissionState
from ..workers.cycles import fewer_cycle_collections
from ..workers.stopping import stop_asked
from ..workers.thread_switching import quicker_thread_switches
from .core import backoff, change_state, enqueue
from .job_states import refresh_job_state
from .jobs import judge_currency
from .recording import CheckedDraft, checked_draft, record_chunk
from .requests import build_requests
from .submitting import set_submission_state

# A worker reading a long unit renews its lease this often.
LEASE_RENEWAL = timedelta(seconds=30)
# Lines read from a slow stream wait at most this long (seconds) before they are recorded.
CHUNK_MAX_AGE = 2.0
# Chunks of a results file recorded at once, each by its own thread and connection: two keep both
# of the database's cores busy.
RECORDERS = 2
# With recorders, the first chunk and the last ones are this share of a full chunk: the recorders
# start sooner, and the lines read last are recorded in pieces side by side instead of one whole
# chunk recorded alone after the reading has ended. A chunk set smaller than RAMP_FROM lines (a
# deployment committing every few lines) is kept exactly as set.
RAMP_SHARE = 5
RAMP_FROM = 100


class RecordedRequests:
    """The custom_ids of a submission whose answer is recorded, read from the ledger at the moment
    a synchronous provider is about to ask for one (read before spending). Each look renews this
    worker's lease; once the lease is lost (or the worker stops asking), every request counts as
    taken, so nothing more is sent."""

    def __init__(self, submission_id: int, claim: str):
        self.submission_id, self.claim = submission_id, claim
        self.lost = False

    def stop_asking(self) -> None:
        self.lost = True

    def __contains__(self, custom_id: object) -> bool:
        if self.lost or not Submission.objects.renew_claim(self.submission_id, self.claim):
            self.lost = True
            return True
        entries = SubmissionItem.objects.filter(submission_id=self.submission_id, custom_id=custom_id)
        return entries.exclude(outcome="").exists()


def poll_submission(submission_id: int, *, provider=None) -> str:
    """Ask the provider how an open submission is doing; collect it when it has ended."""
    provider = provider or get_provider(Submission.objects.get(pk=submission_id).provider)
    said = observe_submission(submission_id, provider=provider)
    if said != "ended":
        return said
    if provider.capabilities.delivery == Delivery.PER_REQUEST:
        # Minutes of requests: a task of its own, so the round goes on polling the rest (a
        # round that finds it still ended and unclaimed collects it itself).
        enqueue("ledger.tasks.collect_submission", submission_id)
        return "ended"
    return collect_submission(submission_id, provider=provider)


def observe_submission(submission_id: int, *, provider) -> str:
    """Record what the provider says about an open submission; "ended" once it has ended (the
    submission is then `ended`, waiting to be collected), else the provider's word."""
    submission = Submission.objects.get(pk=submission_id)
    if submission.state != SubmissionState.OPEN:
        return submission.state
    # What the provider says is as of when it was asked: a webhook arriving while its answer travels
    # is newer than the observation (`tasks.waiting_for_webhook`).
    asked_at = timezone.now()
    try:
        status = provider.status(submission.provider_ref)
    except ProviderError as exc:
        expired = results_expired(submission, exc)
        if expired or refused_for_good(submission, exc):
            # Its results are collected as unavailable: every request fails for good.
            with transaction.atomic():
                updated = Submission.objects.filter(pk=submission.pk, state=SubmissionState.OPEN).update(
                    unanswered_reason=ReasonCode.RESULTS_EXPIRED
                    if expired
                    else ReasonCode.RESULTS_UNAVAILABLE,
                    error=stored_text(str(exc)),
                )
                if updated:
                    set_submission_state(
                        submission,
                        SubmissionState.ENDED,
                        reason=f"The provider refused its status past its collect-by date: {exc}"
                        if expired
                        else f"The provider kept refusing its status: {exc}",
                    )
            return "ended"
        # Not an observation: last_observed_* keep what the provider last actually said.
        Submission.objects.filter(pk=submission.pk).update(error=stored_text(str(exc)))
        return "provider error"
    fields = {
        "last_observed_at": asked_at,
        "refusing_since": None,
        "last_observed_status": status.provider_status[:64],
        "request_counts": status.counts.as_dict() if status.counts else {},
        "error": status.problem,
    }
    if not status.ended:
        Submission.objects.filter(pk=submission.pk).update(**fields)
        return status.provider_status
    fields |= {"refused": status.refused, "unanswered_reason": status.unanswered_reason}
    # When the provider says it ended, unless that is later than now (its clock is not ours).
    now = timezone.now()
    ended_at = min(status.ended_at or now, now)
    with transaction.atomic():
        updated = Submission.objects.filter(pk=submission.pk, state=SubmissionState.OPEN).update(**fields)
        if updated:
            set_submission_state(
                submission,
                SubmissionState.ENDED,
                reason=f"Provider says {status.provider_status}",
                ended_at=ended_at,
            )
    return "ended"


def results_expired(submission: Submission, error) -> bool:
    """Whether the provider's refusal (a `ProviderError`) to tell a unit's status or hand over its
    results means it has deleted them: a permanent error once the unit's collect-by date has passed.
    A passing error then is asked again, as ever: the results may still be there."""
    return not error.transient and deadlines.past_collect_by(submission)


def refused_for_good(submission: Submission, error) -> bool:
    """Whether the provider's refusal to tell an accepted unit's status or hand over its results
    (a `ProviderError`) ends the waiting: a permanent error (rule 8) met ever since the provider
    first refused, `PERMANENT_REFUSAL_PATIENCE` ago. Until then it is asked again, round after
    round; the first permanent refusal is noted (`Submission.refusing_since`)."""
    if error.transient:
        return False
    now = timezone.now()
    if submission.refusing_since is None:
        submission.refusing_since = now
        Submission.objects.filter(pk=submission.pk, refusing_since__isnull=True).update(refusing_since=now)
    return now - submission.refusing_since >= PERMANENT_REFUSAL_PATIENCE


# Characters kept of why a collection failed.
PROBLEM_SHOWN = 500


def collect_submission(
    submission_id: int,
    *,
    provider=None,
    seconds: float | None = None,
    chunk: "Callable[..., Chunk] | None" = None,
) -> str:
    """Record every result of an ended submission, a chunk of lines (BATCHDESK_COLLECT_CHUNK) a
    transaction. Running it twice, or again after an interrupted download or a killed worker,
    changes nothing already recorded; a provider paid per request is never asked again for a
    request whose answer is recorded.

    After `seconds` (BATCHDESK_COLLECT_SECONDS unless given; `math.inf`: no limit), or once its
    cluster is stopping, it stops at a chunk's end, releases the submission and queues a task that
    goes on where it stopped, so no task outlives the worker's timeout. `chunk`: how the lines are
    recorded (the acceptance drill's collection that dies mid-chunk, `ledger.actions.drilling`)."""
    claim = Submission.objects.claim(submission_id, states=[SubmissionState.ENDED])
    if not claim:
        return "not claimable"
    try:
        outcome = collect_claimed(submission_id, claim, provider=provider, seconds=seconds, chunk=chunk)
    except (DatabaseError, psycopg.Error) as exc:  # psycopg's own: raised by the recorders' COPY
        note_failed_collection(submission_id, claim, exc, give_back=True)
        raise
    except Exception as exc:
        note_failed_collection(submission_id, claim, exc, give_back=False)
        raise
    Submission.objects.filter(pk=submission_id, collect_failures__gt=0).update(
        collect_failures=0, collect_problem=""
    )
    return outcome


def note_failed_collection(submission_id: int, claim: str, exc: Exception, *, give_back: bool) -> None:
    """A collection that failed for a cause of ours is counted on its unit, with its words, so that
    one that keeps failing is shown to people (`Submission.recording_stuck`) instead of being
    retried in silence; what was recorded stays recorded. One that failed on a database error (an
    outage, a lock that timed out) also lets go of its claim as soon as the database answers again,
    so that the next pass collects the unit at once, not when the lease runs out. Tried for as long
    as the lease would have held the claim anyway."""
    if connection.in_atomic_block:
        return  # the caller's transaction failed with it: the claim goes when it rolls back
    problem = scrub_credentials(f"{type(exc).__name__}: {exc}")[:PROBLEM_SHOWN]
    changes = {"collect_failures": F("collect_failures") + 1, "collect_problem": problem}
    if give_back:
        changes["claimed_until"] = None
    until = time.monotonic() + settings.BATCHDESK_LEASE_SECONDS
    while True:
        try:
            connection.close_if_unusable_or_obsolete()
            Submission.objects.filter(pk=submission_id, claimed_by=claim).update(**changes)
            return
        except DatabaseError:
            if time.monotonic() > until or stop_asked():
                return
            time.sleep(1)


def collect_again(
    submission_id: int, *, provider=None, held: str = "", chunk: "Callable[..., Chunk] | None" = None
) -> str:
    """Read a collected unit's results once more, whole, and offer every line to the recorder, as a
    provider delivering the same results twice would (the acceptance drill's repeated delivery).
    Every line is recorded already, so nothing changes (rule 4); the unit stays collected. `held`:
    the claim the collector's pass queued it with; `chunk`, as `collect_submission`'s."""
    claim = Submission.objects.claim(submission_id, states=[SubmissionState.COLLECTED], held=held)
    if not claim:
        return "not claimable"
    outcome = collect_claimed(submission_id, claim, provider=provider, seconds=math.inf, chunk=chunk)
    if outcome == "collected again":
        Submission.objects.filter(pk=submission_id, claimed_by=claim).update(claimed_until=None)
    return outcome


def collect_claimed(
    submission_id: int,
    claim: str,
    *,
    provider,
    seconds: float | None,
    chunk: "Callable[..., Chunk] | None" = None,
) -> str:
    """`collect_submission`'s (or `collect_again`'s) work once the submission is claimed."""
    deadline = time.monotonic() + (settings.BATCHDESK_COLLECT_SECONDS if seconds is None else seconds)
    submission = Submission.objects.select_related("job__prompt_version").get(pk=submission_id)
    provider = provider or get_provider(submission.provider)
    if submission.state == SubmissionState.COLLECTED:
        recorded = set()  # collected again: every line is offered to the recorder once more
    else:
        recorded = set(submission.entries.exclude(outcome="").values_list("custom_id", flat=True))
    requests = []
    per_request = capabilities(submission.provider).delivery == Delivery.PER_REQUEST
    if per_request:
        requests = [r for r in build_requests(submission, ItemState.SUBMITTED) if r.custom_id not in recorded]
        recorded = RecordedRequests(submission_id, claim)
    # A server answering request by request is paid for each answer: each is recorded the moment
    # it arrives, so a killed worker loses only the requests in flight. A file's chunks are each
    # recorded beside the reading of the next (on PostgreSQL, unless the caller holds a
    # transaction the chunks must be part of).
    overlap = not per_request and connection.vendor == "postgresql" and not connection.in_atomic_block
    chunk = (chunk or Chunk)(
        submission, size=1 if per_request else settings.BATCHDESK_COLLECT_CHUNK, overlap=overlap
    )
    if overlap:
        # How many lines the file should still hold: the unit's requests not recorded yet.
        chunk.expect(submission.entries.filter(outcome="").count())
    with fewer_cycle_collections(), quicker_thread_switches() if overlap else nullcontext():
        try:
            return collect_lines(
                submission,
                provider=provider,
                chunk=chunk,
                claim=claim,
                recorded=recorded,
                requests=requests,
                deadline=deadline,
            )
        finally:
            chunk.close()


def collect_lines(
    submission: Submission,
    *,
    provider,
    chunk: "Chunk",
    claim: str,
    recorded: "set[str] | RecordedRequests",
    requests: list,
    deadline: float,
) -> str:
    """`collect_submission`'s work once the submission is claimed: every line of the results,
    then the requests the results did not answer, recorded through `chunk`."""
    submission_id = submission.pk
    per_request = isinstance(recorded, RecordedRequests)
    seen: set[str] = set()
    lines = {"succeeded": 0, "failed": 0}
    renewed = timezone.now()
    handing_over = False
    given_up = submission.unanswered_reason in (ReasonCode.RESULTS_UNAVAILABLE, ReasonCode.RESULTS_EXPIRED)
    # A server answering each request that answers again no longer refuses our key nor asks us to
    # slow down: noted at its first answer of the round.
    answered_again = not per_request
    try:
        results = (
            () if given_up else provider.results(submission.provider_ref, skip=recorded, requests=requests)
        )
        for line in results:
            if not isinstance(line, ResultLine):
                chunk.add(
                    {
                        "kind": "unreadable_line",
                        "line": line.line_number,
                        "problem": line.problem,
                        "text": line.text,
                    }
                )
            elif line.custom_id in seen:
                chunk.add({"kind": "repeated_line", "custom_id": line.custom_id})
            else:
                if not answered_again:
                    answered_again = True
                    Submission.objects.filter(pk=submission_id).update(
                        refusing_since=None, slowed_until=None, error=""
                    )
                seen.add(line.custom_id)
                lines["succeeded" if line.succeeded else "failed"] += 1
                if per_request or line.custom_id not in recorded:
                    chunk.add(line)
            if not chunk.full():
                continue
            if timezone.now() - renewed > LEASE_RENEWAL:  # keep the lease while a long unit streams in
                if not Submission.objects.renew_claim(submission_id, claim):
                    return "claim lost"  # another worker took over: it records what this one read
                renewed = timezone.now()
            chunk.record()
            if not handing_over and (time.monotonic() > deadline or stop_asked()):
                if not per_request:
                    chunk.wait()
                    return hand_over(submission_id, claim)
                # A server answering request by request: nothing more is asked, and the answers
                # to requests already asked (and paid for) are recorded before handing over.
                recorded.stop_asking()
                handing_over = True
        chunk.record()
        chunk.wait()
        if handing_over:
            return hand_over(submission_id, claim)
    except ProviderError as exc:
        # Lines read so far are recorded; the next round reads again and skips them.
        chunk.record()
        chunk.wait()
        expired = results_expired(submission, exc)
        if not expired and not refused_for_good(submission, exc):
            again_at = timezone.now() + backoff(1, exc.retry_after)
            # A 429 is the provider asking for time, not a failure: the unit waits until then.
            Submission.objects.filter(pk=submission_id).update(
                error=stored_text(str(exc)),
                claimed_until=again_at,
                slowed_until=again_at if exc.status == 429 else None,
            )
            return "interrupted"
        # The lines read are kept; the requests they do not answer fail for good, below.
        given_up = True
        reason = ReasonCode.RESULTS_EXPIRED if expired else ReasonCode.RESULTS_UNAVAILABLE
        submission.unanswered_reason, submission.error = reason, stored_text(str(exc))
        Submission.objects.filter(pk=submission_id).update(
            unanswered_reason=submission.unanswered_reason, error=submission.error
        )
    if not Submission.objects.renew_claim(submission_id, claim):
        return "claim lost"  # another worker took over; what this one recorded stays recorded
    asked = {r.custom_id for r in requests}
    unanswered = list(submission.entries.filter(outcome="").order_by("id").values_list("pk", "custom_id"))
    never_asked = [pk for pk, custom_id in unanswered if per_request and custom_id not in asked]
    # Never asked: its item had moved on (a cancelled job) before its request was made.
    SubmissionItem.objects.filter(pk__in=never_asked, outcome="").update(outcome="not_sent")
    failure = unanswered_failure(submission)
    for _, custom_id in unanswered:
        if per_request and custom_id not in asked:
            continue
        if failure["reason"] == ReasonCode.MISSING_RESULT:
            chunk.add({"kind": "missing_result", "custom_id": custom_id})
        chunk.add(ResultLine(custom_id=custom_id, succeeded=False, **failure))
        if chunk.full():
            chunk.record()
    chunk.record()
    chunk.wait()  # the provider's counts are compared last, after every line is noted
    counts = submission.request_counts or {}
    if (
        counts
        and not requests
        and not given_up
        and (counts.get("succeeded"), counts.get("failed")) != (lines["succeeded"], lines["failed"])
    ):
        chunk.add({"kind": "counts_disagree", "provider_counts": counts, "lines_in_results": lines})
    chunk.record()
    chunk.wait()
    if submission.state == SubmissionState.COLLECTED:
        return "collected again"  # `collect_again`: the unit was collected before
    with transaction.atomic():
        set_submission_state(submission, SubmissionState.COLLECTED, claimed_until=None, error="")
    refresh_job_state(submission.job_id)
    return "collected"


def unanswered_failure(submission: Submission) -> dict:
    """How a request of an ended unit that its results did not answer failed (a `ResultLine`'s
    error_code, error_message, reason and transient), from what the unit's end says."""
    if submission.refused:
        # The provider refused the unit itself (e.g. its input): permanent, with its reason.
        return {
            "error_code": "batch_refused",
            "error_message": submission.error or "The provider refused the batch",
            "reason": ReasonCode.BATCH_REFUSED,
        }
    if submission.unanswered_reason == ReasonCode.RESULTS_EXPIRED:
        # Past its collect-by date: the work ran and was likely paid for, so an operator decides
        # whether to pay for it again (never by itself).
        return {
            "error_code": ReasonCode.RESULTS_EXPIRED.value,
            "error_message": "the provider deleted the results before they were collected "
            f"(due by {submission.collect_by:%Y-%m-%d %H:%M} UTC; it answered: {submission.error})",
            "reason": ReasonCode.RESULTS_EXPIRED,
        }
    if submission.unanswered_reason == ReasonCode.RESULTS_UNAVAILABLE:
        # Refused for good (`refused_for_good`): permanent; an operator decides whether to pay again.
        return {
            "error_code": ReasonCode.RESULTS_UNAVAILABLE,
            "error_message": f"The provider would not hand over this batch's results ({submission.error})",
            "reason": ReasonCode.RESULTS_UNAVAILABLE,
        }
    if submission.unanswered_reason:
        # The provider says why it ran no request of these (the unit expired): transient.
        return {
            "error_code": submission.unanswered_reason,
            "error_message": f"The provider ended the batch ({submission.last_observed_status}) without running this request",
            "reason": submission.unanswered_reason,
            "transient": True,
        }
    return {
        "error_code": "missing_result",
        "error_message": "The provider returned no line for this request",
        "reason": ReasonCode.MISSING_RESULT,
        "transient": True,
    }


def hand_over(submission_id: int, claim: str) -> str:
    """This task's time is up: release the submission, still `ended`, to a task that goes on."""
    Submission.objects.filter(pk=submission_id, claimed_by=claim).update(claimed_until=None)
    enqueue("ledger.tasks.collect_submission", submission_id)
    return "continues"


class Chunk:
    """What the results stream gave since the last chunk was recorded, in order, recorded as one
    transaction by `record_chunk`. Also recorded when its oldest line has waited CHUNK_MAX_AGE
    (a slow stream), so read lines do not wait long unrecorded.

    With `overlap`, chunks are recorded by RECORDERS threads, each with its own connection, while
    this one reads the next: the database's work on two chunks (the threads wait for it without the
    GIL) runs on both of the machine's cores, beside the parsing of the next. Each chunk still
    commits whole or not at all, and its requests are marked recorded in the same transaction, so
    a killed worker leaves whole chunks behind (not always a prefix of the file: the chunk after
    one that waits may commit first) and the next collection skips exactly those. Two chunks never
    share a request or an item. `close` waits for the last ones."""

    def __init__(self, submission: Submission, *, size: int, overlap: bool = False):
        self.submission, self.size = submission, max(1, size)
        self.full_size = self.size
        # Lines still expected (`expect`): unknown, every chunk is full-sized.
        self.expected: int | None = None
        # Each draft read as its provider was asked for it (rule 19): in the dialect it was sent.
        self.checker = DraftChecker.of(
            submission.job.prompt_version, dialect=schema_dialect(submission.provider)
        )
        # Read once a collection: every part is scrubbed of them (`storable`).
        self.secrets = tuple(s for s in configured_secrets() if len(s) >= SHORTEST_SECRET_ANYWHERE)
        self.parts: list = []
        # Each draft is checked as it is read (what depends on the draft alone): overlapping, by
        # this thread, while the recording threads wait for the database.
        self.checks: dict[str, CheckedDraft] = {}
        self.lines = 0
        self.started = 0.0
        # One thread per recorder, so each keeps its own connection and closes it at the end.
        self.recorders = (
            [ThreadPoolExecutor(1, thread_name_prefix=f"record_chunk_{n}") for n in range(RECORDERS)]
            if overlap
            else []
        )
        self.recording: deque[Future] = deque()
        self.handed = 0

    def add(self, part) -> None:
        if not self.parts:
            self.started = time.monotonic()
        # What cannot be kept of it fails its request alone, or is an anomaly of its own.
        for kept in storable(part, secrets=self.secrets):
            self.parts.append(kept)
            if not isinstance(kept, dict):
                self.lines += 1
                if kept.succeeded:
                    self.checks[kept.custom_id] = checked_draft(self.checker, kept)

    def expect(self, lines: int) -> None:
        """The file should hold `lines` more lines: with recorders, the first chunk and the last
        ones are smaller (RAMP_SHARE), so that recording starts early and ends soon after reading
        (chunks of RAMP_FROM lines or more)."""
        if self.full_size < RAMP_FROM:
            return
        self.expected = lines
        self.size = max(1, self.full_size // RAMP_SHARE)

    def next_size(self, read: int) -> int:
        """The size of the chunk after one of `read` lines: a full chunk, or, as the lines expected
        run out, a share of those left per recorder, never under a ramp's chunk."""
        if self.expected is None:
            return self.full_size
        self.expected -= read
        smallest = max(1, self.full_size // RAMP_SHARE)
        return min(self.full_size, max(smallest, self.expected // RECORDERS))

    def full(self) -> bool:
        return self.lines >= self.size or (
            bool(self.parts) and time.monotonic() - self.started > CHUNK_MAX_AGE
        )

    def record(self) -> None:
        """Record what was read so far: now, or (overlapping) by a recording thread once fewer than
        RECORDERS chunks are being recorded, while this one goes on reading."""
        if not self.parts:
            return
        parts, checks = self.parts, self.checks
        self.size = self.next_size(self.lines)
        self.parts, self.checks, self.lines = [], {}, 0
        if not self.recorders:
            record_chunk(self.submission, parts, checker=self.checker, checks=checks)
            return
        while len(self.recording) >= len(self.recorders):
            self.recording.popleft().result()
        recorder = self.recorders[self.handed % len(self.recorders)]
        self.handed += 1
        self.recording.append(
            recorder.submit(record_chunk, self.submission, parts, checker=self.checker, checks=checks)
        )

    def wait(self) -> None:
        """Wait until every chunk handed over is committed (or raise what recording one raised)."""
        while self.recording:
            self.recording.popleft().result()

    def close(self) -> None:
        """Wait for the chunks being recorded, then end the recording threads and their connections."""
        recorders, self.recorders = self.recorders, []
        try:
            self.wait()
        finally:
            for recorder in recorders:
                recorder.submit(close_connection).result()
                recorder.shutdown()


def close_connection() -> None:
    connection.close()  # the calling thread's own


def retry_inference(
    item_id: int, *, actor=None, reason: str, delay: timedelta = timedelta(), **fields
) -> Item:
    """Send this item's inference again, alone, in a new unit, unless its product was withdrawn
    or revised meanwhile (then it stops here and the current revision is queued instead)."""
    with transaction.atomic():
        item = Item.objects.get(pk=item_id)
        changed = change_state(
            item.pk,
            to=ItemState.PREPARED,
            actor=actor,
            reason=reason,
            expect=[
                ItemState.INFERENCE_FAILED,
                ItemState.VALIDATION_FAILED,
                ItemState.REJECTED,
                ItemState.DEAD_LETTER,
            ],
            inference_attempt=F("inference_attempt") + 1,
            submission=None,
            approved_version=None,
            next_attempt_at=timezone.now() + delay if delay else None,
            **fields,
        )
        if judge_currency(changed, actor=actor):
            changed.refresh_from_db()
        else:
            enqueue("ledger.tasks.submit_job", item.job_id)
    return changed
