"""Telling people and systems when a job moves (SPEC §6 `notify_url`).

Each change of a job's state, a budget that pauses it and a pilot's report becoming ready is written
as a `JobNotification` in the transaction of the change (the outbox): a webhook to the job's
`notify_url`, and an e-mail to its owner when the job reaches review, needs attention or is
completed. A worker sends each once the change has committed, never inside it, so a receiver that is
down or slow never holds up the ledger. Webhooks are signed as Standard Webhooks do
(`signed_webhooks`); the `webhook-id` stays the same on every attempt, so a receiver drops repeats.
A failed attempt is tried again with a doubling wait, picked up by the collector's pass, until 24
hours after the event; then the notification is given up. Every attempt is recorded with the
receiver's status and the start of its answer, scrubbed.

A receiver is named by a person, so its address is checked when the job starts and again at each
call, after resolution (`receivers`): notices go out, never in. Redirects are never followed.
Whatever goes wrong while sending is an attempt with its reason, so the 24-hour give-up holds
whatever happens.
"""

import asyncio
import json
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import checks
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Count, F, Q
from django.utils import timezone
from django_q.tasks import async_task

from ..drafts.scrubbing import scrub_credentials, stored_text
from ..models import ItemTally, Job, JobNotification, NotificationAttempt, NotificationChannel, Pilot
from ..pilots.report import Report
from ..setting_files import setting_refused
from ..states import JobState
from .receivers import Target, UnsafeAddress, target_of
from .signed_webhooks import signed_headers, signer

log = logging.getLogger(__name__)

# Events besides a state's own `job.<state>`.
BUDGET_REACHED = "job.budget_reached"
PILOT_REPORT_READY = "job.pilot_report_ready"
# The owner is e-mailed when the job reaches one of these: a person has something to do or to know.
EMAILED_STATES = frozenset({JobState.IN_REVIEW, JobState.NEEDS_ATTENTION, JobState.COMPLETED})
GIVE_UP_AFTER = timedelta(hours=24)
LONGEST_WAIT = timedelta(hours=1)
# A new notification's task has this long to take it before the collector's pass sends it instead
# (the task was lost: a broker that was down, a worker killed).
FIRST_TRY_WITHIN = timedelta(seconds=60)
# What is kept of a receiver's answer: the start of it, scrubbed.
ANSWER_EXCERPT = 200
ANSWER_BYTES_READ = 2048
# What a try's columns hold (`NotificationAttempt.error` and `.answer`).
NOTICE_TEXT_CHARS = 300
MOST_PER_PASS = 1000
SEND_TASK = "ledger.tasks.send_notification"


def check_notify_secret(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """System check: a notify secret that is set but cannot sign stops every process at startup."""
    return setting_refused(
        "BATCHDESK_NOTIFY_SECRET",
        signer,
        ValueError,
        hint="Set it to whsec_ and base64 (e.g. whsec_ and `openssl rand -base64 32`), or unset it.",
        id="batchdesk.E005",
        named=True,
    )


# --- the outbox ----------------------------------------------------------------------------


def job_state_changed(job: Job, state: str) -> None:
    """Announce that `job` is now in `state`: `job.<state>`. Within the change's transaction."""
    announce(job, f"job.{state}", state=state)


def announce(job: Job, event_type: str, *, state: str) -> None:
    """Write the event's notifications for `job` (now in `state`) in the caller's transaction: one
    to the job's notify_url, one to its owner's e-mail when `state` calls for it; each is sent
    once the transaction commits."""
    recipients = []
    if job.notify_url:
        recipients.append((NotificationChannel.WEBHOOK, job.notify_url))
    # People are e-mailed about the states that ask something of them, not about budgets or pilots.
    if event_type == f"job.{state}" and state in EMAILED_STATES:
        email = get_user_model().objects.filter(pk=job.owner_id).values_list("email", flat=True).first()
        if email:
            recipients.append((NotificationChannel.EMAIL, email))
    if not recipients:
        return
    now = timezone.now()
    body = json.dumps(
        {
            "type": event_type,
            "timestamp": now.isoformat(),
            "job": {
                "id": job.pk,
                "reference": job.reference,
                "state": state,
                "counts": ItemTally.objects.filter(job_id=job.pk).counts_by_state(),
            },
        },
        separators=(",", ":"),
    ).encode()
    first_try = now + FIRST_TRY_WITHIN
    written = JobNotification.objects.bulk_create(
        JobNotification(
            job_id=job.pk,
            channel=channel,
            message_id=f"msg_{uuid.uuid4().hex}",
            event_type=event_type,
            recipient=recipient,
            body=body,
            created_at=now,
            next_attempt_at=first_try,
        )
        for channel, recipient in recipients
    )
    for notification in written:
        # As `actions.core.enqueue` does (which cannot be imported here: the actions announce through this
        # module): a broker that cannot take the task leaves the row to the collector's pass.
        transaction.on_commit(lambda pk=notification.pk: async_task(SEND_TASK, pk, first_try), robust=True)


def pilot_report_checked(job: Job, state: str) -> None:
    """Announce `job.pilot_report_ready` the first time the job, a pilot with a notify_url, has
    enough decisions for its report (what `GET /api/jobs/{id}/pilot` answers 409 to until then).
    Within the transaction of the change that may have made it ready, the job's row locked."""
    if not job.notify_url:
        return
    pilot = Pilot.objects.filter(job_id=job.pk).first()
    if pilot is None or JobNotification.objects.filter(job_id=job.pk, event_type=PILOT_REPORT_READY).exists():
        return
    if Report(pilot).decisions.enough:
        announce(job, PILOT_REPORT_READY, state=state)


def claim_due(now: datetime) -> tuple[datetime, list[int]]:
    """Notifications whose attempt is due (a retry, a lost task, a worker that died holding one),
    marked as taken until the end of a lease: (the mark, their ids), for the collector's pass."""
    mark = now + lease()
    # Past its last attempt's time by an hour and still not given up: no attempt could be recorded
    # (a worker killed each time, a record refused). The 24 hours hold whatever happens.
    JobNotification.objects.filter(
        delivered_at__isnull=True,
        gave_up_at__isnull=True,
        next_attempt_at__lte=now,
        created_at__lt=now - GIVE_UP_AFTER - LONGEST_WAIT,
    ).update(gave_up_at=now, next_attempt_at=None)
    with transaction.atomic():
        ids = list(
            JobNotification.objects.select_for_update(skip_locked=True)
            .filter(next_attempt_at__lte=now)
            .order_by("next_attempt_at", "pk")
            .values_list("pk", flat=True)[:MOST_PER_PASS]
        )
        JobNotification.objects.filter(pk__in=ids).update(next_attempt_at=mark)
    return mark, ids


def lease() -> timedelta:
    """How long a worker holds a notification it sends: longer than one call can take."""
    return timedelta(seconds=settings.BATCHDESK_NOTIFY_TIMEOUT + 60)


# --- sending -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    delivered: bool = False
    status: int | None = None
    error: str = ""
    answer: str = ""


def send(notification_id: int, mark: datetime) -> str:
    """One attempt to deliver the notification, if it still carries `mark` (the next attempt it was
    queued for; a worker sending it holds another), and its record. Safe to run twice."""
    now = timezone.now()
    held_until = now + lease()
    taken = JobNotification.objects.filter(
        pk=notification_id, next_attempt_at=mark, delivered_at__isnull=True, gave_up_at__isnull=True
    ).update(next_attempt_at=held_until)
    if not taken:
        return "not due"
    notification = JobNotification.objects.get(pk=notification_id)
    try:
        if notification.channel == NotificationChannel.WEBHOOK:
            outcome = post_webhook(notification)
        else:
            outcome = send_email(notification)
    except Exception as error:  # noqa: BLE001 - an attempt with its reason, never a task failing for ever
        log.warning("Notification %s could not be sent", notification.pk, exc_info=True)
        outcome = Outcome(error=excerpt(f"Could not be sent ({type(error).__name__}): {error}"))
    record(notification, outcome, held_until)
    return "delivered" if outcome.delivered else "not delivered"


def record(notification: JobNotification, outcome: Outcome, held_until: datetime) -> None:
    """The attempt, and what comes next: nothing once delivered or 24 hours after the event, else
    another attempt after a wait that doubles with each (at most an hour)."""
    now = timezone.now()
    attempts = notification.attempts + 1
    give_up_at = notification.created_at + GIVE_UP_AFTER
    if outcome.delivered:
        after = {"delivered_at": now, "next_attempt_at": None}
    elif now >= give_up_at:
        after = {"gave_up_at": now, "next_attempt_at": None}
    else:
        wait = min(
            timedelta(seconds=settings.BATCHDESK_NOTIFY_RETRY_SECONDS * 2 ** (attempts - 1)), LONGEST_WAIT
        )
        after = {"next_attempt_at": min(now + wait, give_up_at)}
    with transaction.atomic():
        NotificationAttempt.objects.create(
            notification=notification,
            at=now,
            delivered=outcome.delivered,
            status=outcome.status,
            error=stored_text(outcome.error, limit=NOTICE_TEXT_CHARS),
            answer=stored_text(outcome.answer, limit=NOTICE_TEXT_CHARS),
        )
        JobNotification.objects.filter(pk=notification.pk, next_attempt_at=held_until).update(
            attempts=F("attempts") + 1, **after
        )


def post_webhook(notification: JobNotification) -> Outcome:
    """POST the event's bytes, signed, to the checked address; 2xx is delivered. The answer's
    first bytes are kept, scrubbed; a redirect is an answer like any other, never followed."""
    secret = settings.BATCHDESK_NOTIFY_SECRET
    if not secret:
        return Outcome(error="BATCHDESK_NOTIFY_SECRET is not set: events are never sent unsigned")
    try:
        target = target_of(notification.recipient)
    except UnsafeAddress as refusal:
        return Outcome(error=str(refusal))
    headers = {
        "Host": target.host_header,
        "Content-Type": "application/json",
        "User-Agent": "BatchDesk notifications",
        **signed_headers(
            secret, message_id=notification.message_id, at=timezone.now(), body=notification.body
        ),
    }
    timeout = settings.BATCHDESK_NOTIFY_TIMEOUT
    try:
        status, start = asyncio.run(call_receiver(target, notification.body, headers, timeout))
    except (httpx.TimeoutException, TimeoutError):
        return Outcome(error=f"No answer within {timeout:g} seconds")
    except httpx.HTTPError as error:
        return Outcome(error=excerpt(f"Could not be reached: {error}"))
    return Outcome(
        delivered=200 <= status < 300,
        status=status,
        answer=excerpt(start.decode("utf-8", "replace")),
    )


async def call_receiver(target: Target, body: bytes, headers: dict, timeout: float) -> tuple[int, bytes]:
    """The receiver's status and the first bytes of its answer, all within `timeout` seconds.
    httpx's timeout bounds each read only: a receiver dripping a byte a second would hold a worker
    for as long as it likes (and, past the lease, get the event twice). The whole call is cancelled
    at the deadline instead."""
    async with asyncio.timeout(timeout):
        async with (
            httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False) as client,
            client.stream(
                "POST", target.url, content=body, headers=headers, extensions=target.extensions
            ) as response,
        ):
            start = b""
            async for chunk in response.aiter_bytes():
                start += chunk
                if len(start) >= ANSWER_BYTES_READ:
                    break
            return response.status_code, start


def excerpt(text: str) -> str:
    text = scrub_credentials(text).strip()
    return text if len(text) <= ANSWER_EXCERPT else text[: ANSWER_EXCERPT - 1] + "…"


def send_email(notification: JobNotification) -> Outcome:
    """The owner's e-mail, through Django's mail settings."""
    event = json.loads(bytes(notification.body))
    job = event["job"]
    label = JobState(job["state"]).label
    counts = "\n".join(f"  {state}: {count:,}" for state, count in sorted(job["counts"].items()))
    # A subject is one line (Django refuses a line break in it): a reference holding any is shown with
    # its runs of white space as single spaces there, and whole in the body.
    subject_reference = " ".join(job["reference"].split())
    try:
        send_mail(
            subject=f"BatchDesk job {subject_reference}: {label.split(':')[0].lower()}",
            message=(
                f"Your job {job['reference']} (number {job['id']}) is now {label[0].lower()}{label[1:]}.\n\n"
                f"Items by state:\n{counts}\n\nSee /jobs/{job['id']}/ in BatchDesk.\n"
            ),
            from_email=None,
            recipient_list=[notification.recipient],
        )
    except Exception as error:  # noqa: BLE001 - whatever the mail server says is recorded and retried
        return Outcome(error=excerpt(f"The mail server refused or could not be reached: {error}"))
    return Outcome(delivered=True)


def undelivered() -> dict[str, int]:
    """Notifications not delivered, for `/metrics`: `retrying` (an attempt failed, another is due)
    and `given_up` (24 hours of attempts failed)."""
    found = JobNotification.objects.filter(delivered_at__isnull=True).aggregate(
        retrying=Count("pk", filter=Q(gave_up_at__isnull=True, attempts__gt=0)),
        given_up=Count("pk", filter=Q(gave_up_at__isnull=False)),
    )
    return {"retrying": found["retrying"], "given_up": found["given_up"]}
