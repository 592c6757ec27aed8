"""Batch webhooks as the providers that send them post them (reference/providers.md §8.4): when a
unit ends, its event is posted to the `webhook_url` knob, signed as Standard Webhooks do with
`webhook_secret`, `webhook_deliveries` times with the same webhook-id, and tried again while the
receiver does not take it."""

import json
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from ledger.emulators.knobs import FaultKnobs
from ledger.notices.signed_webhooks import signed_headers

# How often a serving emulator brings its units up to date by itself (`keep_time`, the announcer).
KEEP_TIME_SECONDS = 0.1
# A webhook the receiver did not take (no answer, or a 5xx) is tried again this many times, the
# wait doubling from WEBHOOK_RETRY_SECONDS (a provider goes on for a day or three).
WEBHOOK_ATTEMPTS = 6
WEBHOOK_RETRY_SECONDS = 0.25


@dataclass
class Webhook:
    """A unit's end as its provider announces it: where to, signed with what, and the event."""

    url: str
    secret: str | None
    deliveries: int
    message_id: str
    event_type: str
    unit: str
    body: bytes


class Announcer:
    """An emulator's webhooks: those due (`announce`) and those posted with their answers (`sent`).
    `lock` is the emulator's, `advance` brings its units up to date."""

    def __init__(self, *, name: str, lock: AbstractContextManager, advance: Callable[[], None]) -> None:
        self._name, self._lock, self._advance = name, lock, advance
        self._outbox: list[Webhook] = []  # ended units' webhooks not yet posted
        self.sent: list[dict] = []  # what was posted and answered, for `stats`
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def announce(self, knobs: FaultKnobs, event_type: str, unit: str, event: dict) -> None:
        """A unit has ended: its provider's webhook `event` is posted, if `webhook_url` is set, by
        the announcer (callers hold the lock; nothing is sent while it is held)."""
        if not knobs.webhook_url:
            return
        self._outbox.append(
            Webhook(
                url=knobs.webhook_url,
                secret=knobs.webhook_secret,
                deliveries=knobs.webhook_deliveries,
                message_id=f"wh_{uuid.uuid4().hex}",
                event_type=event_type,
                unit=unit,
                body=json.dumps(event, separators=(",", ":")).encode(),
            )
        )

    def start(self) -> None:
        """Every KEEP_TIME_SECONDS, bring the units up to date, as a provider notices a batch's end
        whether anyone asks or not, and post the webhooks of those that ended. Started while the
        emulator serves (from a thread of a test or from `run_emulator`) with a `webhook_url` set."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(KEEP_TIME_SECONDS):
                with self._lock:
                    self._advance()
                    due, self._outbox = self._outbox, []
                for webhook in due:
                    for _ in range(webhook.deliveries):
                        self._post(client, webhook)

    def _post(self, client: httpx.Client, webhook: Webhook) -> None:
        """One delivery, tried again while the receiver does not take it; its answers are recorded."""
        answers: list[int | str] = []
        for attempt in range(WEBHOOK_ATTEMPTS):
            if attempt:
                time.sleep(WEBHOOK_RETRY_SECONDS * 2 ** (attempt - 1))
            headers = {"content-type": "application/json"}
            if webhook.secret:
                headers |= signed_headers(
                    webhook.secret, message_id=webhook.message_id, at=datetime.now(UTC), body=webhook.body
                )
            sent_at = time.time()
            try:
                status: int | str = client.post(
                    webhook.url, content=webhook.body, headers=headers
                ).status_code
            except httpx.HTTPError as error:
                status = type(error).__name__
            answers.append(status)
            if isinstance(status, int) and status < 500:
                break
        with self._lock:
            self.sent.append(
                {
                    "id": webhook.message_id,
                    "type": webhook.event_type,
                    "unit": webhook.unit,
                    "sent_at": sent_at,
                    "answers": answers,
                }
            )
