"""What every protocol emulator shares: a threaded HTTP server (Werkzeug's), routing (Werkzeug's
rules), request bodies and multipart forms (Werkzeug's parser), the control endpoints
(`GET /_emulator/stats`, `GET|POST /_emulator/config`), the common fault knobs, and the faults
that happen before a call reaches the protocol: 429 and 5xx storms, lost answers, cut downloads.

A protocol subclasses `EmulatorServer` and supplies its routes, its error envelope, its
credential check and its evidence (what it was asked and did). Everything that involves chance
is drawn from the seed (`dice`), so a run is reproducible.
"""

import contextlib
import hashlib
import json
import logging
import math
import re
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, ClassVar, NamedTuple

import httpx
from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

from ledger.emulators import textgen
from ledger.emulators.clock import Clock, WallClock
from ledger.notices.signed_webhooks import signed_headers, signer

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 512 * 1024 * 1024


class ApiError(Exception):
    """An HTTP error answered with the protocol's own envelope (`EmulatorServer.error` builds it)."""

    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(json.dumps(body)[:200])
        self.status = status
        self.body = body
        self.headers = headers or {}


class LoseAnswer(Exception):
    """The call did its work, but a fault knob says its caller must never hear the answer."""


class KnobError(ValueError):
    """A knob was given a value it cannot take; answered 400 in the protocol's envelope."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


class Download(NamedTuple):
    """A file's bytes, and where to hang up if a fault knob cuts this download short."""

    content: bytes
    cut_at: int | None = None
    content_type: str = "application/octet-stream"


# --- knobs ------------------------------------------------------------------------------------


def share(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise KnobError(name, f"{name} must be a number from 0 to 1")
    return value


def duration(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise KnobError(name, f"{name} must be a number of at least 0")
    return value


def optional_duration(name: str, value: Any) -> float | None:
    return None if value is None else duration(name, value)


def count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise KnobError(name, f"{name} must be a whole number of at least 0")
    return value


def call_numbers(name: str, value: Any) -> list[int]:
    if not (
        isinstance(value, list | tuple | set | frozenset)
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in value)
    ):
        raise KnobError(name, f"{name} must be a list of whole numbers of at least 1")
    return sorted(set(value))


def path(name: str, value: Any) -> str | None:
    if value is None:
        return None
    method, _, prefix = value.rpartition(" ") if isinstance(value, str) else ("", "", "")
    if not prefix.startswith("/") or method not in {"", "GET", "POST", "PUT", "DELETE"}:
        raise KnobError(name, f"{name} must be a path prefix such as '/v1/batches' or 'POST /v1/batches'")
    return value


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise KnobError(name, f"{name} must be true or false")
    return value


def status_code(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 500 <= value <= 599:
        raise KnobError(name, f"{name} must be an HTTP status from 500 to 599")
    return value


def refusal_status(name: str, value: Any) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 400 <= value <= 499
        or value in (408, 429)
    ):
        raise KnobError(name, f"{name} must be a permanent HTTP status: 4xx, not 408 or 429")
    return value


def hook_url(name: str, value: Any) -> str | None:
    if value is not None and not (isinstance(value, str) and value.startswith(("http://", "https://"))):
        raise KnobError(name, f"{name} must be an http:// or https:// address, or null")
    return value


def hook_secret(name: str, value: Any) -> str | None:
    if value is None:
        return None
    try:
        signer(value if isinstance(value, str) else "")
    except ValueError:
        raise KnobError(name, f"{name} must read whsec_ followed by base64, or be null") from None
    return value


def positive_count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise KnobError(name, f"{name} must be a whole number of at least 1")
    return value


def knob(default: Any, check: Callable[[str, Any], Any]) -> Any:
    if isinstance(default, list):
        return field(default_factory=list, metadata={"check": check})
    return field(default=default, metadata={"check": check})


@dataclass
class FaultKnobs:
    """What the emulator constructor, `configure(...)`, `POST /_emulator/config` and the flags of
    `run_emulator` set. Everything but the pace is off by default.

    Calls are counted from when their knob was set, and `GET /_emulator/config` shows what is
    still to come ("the next 2 calls", "the 3rd unit created from now"), so posting back what it
    shows changes nothing. Knobs that shape results apply to requests not yet run and to results
    not yet written.
    """

    per_request_ms: float = knob(100, duration)  # simulated time to answer one request
    fail_rate: float = knob(0.0, share)  # share of requests that fail with a server error
    expire_rate: float = knob(0.0, share)  # share of requests that expire unrun
    # A unit in progress this long expires: requests not yet run expire.
    expire_after_ms: float | None = knob(None, optional_duration)
    # The N-th unit created from now (calls refused by a knob don't count) is created, but the
    # connection is dropped instead of answering.
    lose_create_responses: list[int] = knob([], call_numbers)
    # The next K API calls (optionally only those whose path starts with the prefix, itself
    # optionally led by a method: "POST /v1/batches") are refused before doing anything: 429
    # with `retry-after: retry_after` (seconds), or `server_error_status`.
    rate_limit_calls: int = knob(0, count)
    rate_limit_path: str | None = knob(None, path)
    retry_after: float = knob(1, duration)
    server_errors: int = knob(0, count)
    server_error_path: str | None = knob(None, path)
    server_error_status: int = knob(500, status_code)
    # Likewise refused with a permanent error, `refusal_status` (a 4xx: the unit is not found, the
    # key is not allowed), as a provider answers for a unit it lost or a key it no longer takes.
    refusals: int = knob(0, count)
    refusal_path: str | None = knob(None, path)
    refusal_status: int = knob(404, refusal_status)
    # The next K units created from now are refused as the provider refuses an account it will not
    # bill (no credit, a spend limit), each protocol in its own words (`billing_refusal`).
    billing_refusals: int = knob(0, count)
    # Results: this share of success lines written twice, this many lines with custom_ids never
    # sent, this many lines that cannot be read; all at seeded places. `count_mismatch` makes
    # the unit's own counts claim one more success than its results hold.
    duplicate_lines: float = knob(0.0, share)
    unknown_lines: int = knob(0, count)
    malformed_lines: int = knob(0, count)
    count_mismatch: bool = knob(False, flag)
    # The first K downloads of each result file (from when this was set) send the full
    # Content-Length, about half the bytes, then hang up.
    cut_downloads: int = knob(0, count)
    # Answers, each in the protocol's own words: this share of the requests that succeed is cut off
    # at the output-token limit, refused by the model, answered with the JSON in a Markdown code
    # fence, or answered in prose where JSON was asked for (`textgen.answer`).
    truncate_rate: float = knob(0.0, share)
    refuse_rate: float = knob(0.0, share)
    fence_rate: float = knob(0.0, share)
    prose_rate: float = knob(0.0, share)
    # Batch webhooks (reference/providers.md §8.4), for the protocols whose provider sends them
    # (OpenAI, Gemini): when a unit ends, its event is posted to `webhook_url`, signed as Standard
    # Webhooks do with `webhook_secret`, `webhook_deliveries` times with the same webhook-id (at
    # least once, as the providers promise; 2 exercises a receiver's deduplication).
    webhook_url: str | None = knob(None, hook_url)
    webhook_secret: str | None = knob(None, hook_secret)
    webhook_deliveries: int = knob(1, positive_count)


def _matches(prefix: str | None, method: str, path: str) -> bool:
    """Whether a call falls under a knob's path prefix ("/v1/batches" or "POST /v1/batches")."""
    if prefix is None:
        return True
    wanted_method, _, wanted_path = prefix.rpartition(" ")
    return wanted_method in ("", method) and path.startswith(wanted_path)


def seconds_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def mid_line(content: bytes) -> int:
    """About half of `content`, never just after a newline, so the cut splits a line."""
    cut = len(content) // 2
    return cut - 1 if cut > 1 and content[cut - 1 : cut] == b"\n" else cut


# --- the server -------------------------------------------------------------------------------


# How often a serving emulator brings its units up to date by itself (`keep_time`).
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


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        log.info('"%s" %s %s', self.requestline, code, size)


class EmulatorServer:
    """One protocol's emulated provider: its state, its clock, and the HTTP server in front."""

    protocol: ClassVar[str] = ""
    base_path: ClassVar[str] = "/v1"  # base_url = http://host:port + base_path
    api_prefix: ClassVar[str] = "/v1/"  # calls under it are authenticated and subject to faults
    create_rule: ClassVar[tuple[str, str] | None] = None  # (method, path regex) of a unit's creation
    knobs_class: ClassVar[type[FaultKnobs]] = FaultKnobs

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int = 0,
        clock: Clock | None = None,
        **knobs: Any,
    ) -> None:
        self.host, self.port, self.seed = host, port, seed
        # What the units' timestamps and progress are read from: a test passes a `TestClock` and moves it.
        self.clock = clock or WallClock()
        self.lock = threading.RLock()
        self.knobs = self.knobs_class()
        self._creates = 0
        self._rejected_calls = 0
        self._downloads: Counter = Counter()
        self._cut_downloads: Counter = Counter()  # since `cut_downloads` was last set
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._outbox: list[Webhook] = []  # ended units' webhooks not yet posted
        self._webhooks: list[dict] = []  # what was posted and answered, for `stats`
        self._announcer: threading.Thread | None = None
        self._announcer_stop = threading.Event()
        self._url_map = Map(self.rules() + self._control_rules(), strict_slashes=False)
        self.configure(**knobs)  # a bad knob raises ApiError: nothing serves

    # --- what a protocol supplies ------------------------------------------------------------

    def rules(self) -> list[Rule]:
        raise NotImplementedError

    def billing_refusal(self) -> "ApiError":
        """How the provider refuses to run work it cannot bill; each protocol says it its own way."""
        return self.error(402, f"The {self.protocol} emulator's account cannot be billed.")

    def take_billing_refusal(self) -> bool:
        """For a protocol whose creates `admit` cannot tell from other calls: one refusal taken."""
        with self.lock:
            if not self.knobs.billing_refusals:
                return False
            self.knobs.billing_refusals -= 1
            self._rejected_calls += 1
            return True

    def error(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> ApiError:
        """The protocol's error envelope. `kind`: invalid_request, authentication, not_found,
        rate_limit, server_error or overloaded."""
        raise NotImplementedError

    def authenticate(self, request: Request) -> None:
        raise NotImplementedError

    def answer_headers(self) -> dict[str, str]:
        """Headers on every answer (a provider's request id), unless the answer already has them."""
        return {}

    def evidence(self) -> dict:
        """The protocol's part of `/_emulator/stats`: at least `inferences` and `batches_by_intent`."""
        raise NotImplementedError

    def advance(self) -> None:
        """Bring every unit up to date (called, under the lock, before knobs change)."""

    # --- serving ---------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the emulator is not serving")
        return f"http://{self.host}:{self._server.server_port}{self.base_path}"

    def _bind(self) -> BaseWSGIServer:
        server = make_server(
            self.host, self.port, self.wsgi_app, threaded=True, request_handler=_QuietHandler
        )
        # Keep-alive connections park handler threads; don't wait for them when closing.
        server.block_on_close = False
        server.daemon_threads = True
        self._server = server
        return server

    def start(self) -> str:
        """Serve from a background thread; returns the base URL."""
        server = self._bind()
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"emulator-{self.protocol}",
            daemon=True,
        )
        self._thread.start()
        if self.knobs.webhook_url:
            self._start_announcing()
        return self.base_url

    def stop(self) -> None:
        self._stop_announcing()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()
        self._server = self._thread = None

    def serve_forever(self, on_ready: Callable[[str], None] | None = None) -> None:
        """Serve from this thread until interrupted (`run_emulator`). `on_ready` gets the base
        URL once the port is bound (it is only known then for port 0). Its units are brought up
        to date as time passes, asked about or not (`keep_time`)."""
        server = self._bind()
        stop = threading.Event()
        clock = threading.Thread(target=self.keep_time, args=(stop,), name="emulator-clock", daemon=True)
        clock.start()
        if self.knobs.webhook_url:
            self._start_announcing()
        if on_ready is not None:
            on_ready(self.base_url)
        try:
            server.serve_forever()
        finally:
            stop.set()
            self._stop_announcing()
            server.server_close()

    def keep_time(self, stop: threading.Event, every: float = KEEP_TIME_SECONDS) -> None:
        """Bring every unit up to date every `every` seconds until `stop` is set, as a provider
        works on a batch whether anyone asks or not: a unit's results are written while the
        workers do other things, not while the first poll after its end waits for them. What a
        unit becomes, and when, is the same either way (it follows from its timestamps)."""
        while not stop.wait(every):
            with self.lock:
                self.advance()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- knobs and evidence ----------------------------------------------------------------

    def configure(self, **knobs: Any) -> dict:
        """Change some of the knobs; returns all of them. Nothing changes if one is invalid."""
        names = [knob.name for knob in fields(self.knobs_class)]
        unknown = sorted(set(knobs) - set(names))
        if unknown:
            raise self.error(
                400, f"Unknown knob(s) {', '.join(unknown)}; known: {', '.join(names)}.", param=unknown[0]
            )
        checks = {knob.name: knob.metadata["check"] for knob in fields(self.knobs_class)}
        try:
            checked = {name: checks[name](name, value) for name, value in knobs.items()}
        except KnobError as exc:
            raise self.error(400, str(exc), param=exc.name) from None
        with self.lock:
            # What would have run by now ran under the old knobs; the new ones apply from now on.
            self.advance()
            for name, value in checked.items():
                setattr(self.knobs, name, value)
            if "cut_downloads" in checked:
                self._cut_downloads.clear()
            if self.knobs.webhook_url and self._server is not None:
                self._start_announcing()
            return asdict(self.knobs)

    def config(self) -> dict:
        with self.lock:
            return asdict(self.knobs)

    def stats(self) -> dict:
        """What the emulator was asked and did: the evidence tests check. `inferences`: how often
        each custom_id was generated (= paid for); `creates`: unit-create calls received, refused
        ones included; `downloads`: result downloads per key, cut ones included;
        `rejected_calls`: 429s, 5xxs and 4xxs served by the fault knobs."""
        with self.lock:
            self.advance()
            return {
                **self.evidence(),
                "creates": self._creates,
                "downloads": dict(self._downloads),
                "rejected_calls": self._rejected_calls,
                "webhooks": [dict(sent) for sent in self._webhooks],
            }

    # --- helpers for protocols ---------------------------------------------------------------

    def dice(self, *parts: Any) -> float:
        """A number in [0, 1) drawn from the seed and `parts`: the same parts, the same number."""
        text = ":".join(str(part) for part in (self.seed, *parts))
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8]) / 2**64

    def answer_shape(self, *parts: Any) -> str:
        """How the model answers the request `parts` name (its custom_id and attempt), as the answer
        knobs say: a `textgen` shape, or "" for as asked. Drawn from the seed and `parts`."""
        knobs = self.knobs
        for shape, rate in (
            (textgen.REFUSED, knobs.refuse_rate),
            (textgen.TRUNCATED, knobs.truncate_rate),
            (textgen.FENCED, knobs.fence_rate),
            (textgen.PROSE, knobs.prose_rate),
        ):
            if rate > 0 and self.dice(shape, *parts) < rate:
                return shape
        return ""

    def take_lost_create(self) -> bool:
        """Whether the answer to the unit just created must be lost (call after creating it)."""
        with self.lock:
            lost = 1 in self.knobs.lose_create_responses
            self.knobs.lose_create_responses = [n - 1 for n in self.knobs.lose_create_responses if n > 1]
            return lost

    def download(self, key: str, content: bytes, content_type: str = "application/octet-stream") -> Download:
        """A result download, counted; cut mid-line while `cut_downloads` says so."""
        with self.lock:
            self._downloads[key] += 1
            if self._cut_downloads[key] < self.knobs.cut_downloads and content:
                self._cut_downloads[key] += 1
                log.info("cutting download %s of %s short", self._downloads[key], key)
                return Download(content, mid_line(content), content_type)
            return Download(content, None, content_type)

    def json_body(self, request: Request) -> Any:
        try:
            return json.loads(request.get_data() or b"null")
        except ValueError:
            raise self.error(400, "The request body is not valid JSON.") from None

    # --- batch webhooks ---------------------------------------------------------------------

    def announce(self, event_type: str, unit: str, event: dict) -> None:
        """A unit has ended: its provider's webhook `event` is posted, if `webhook_url` is set, by
        the announcer (callers hold the lock; nothing is sent while it is held)."""
        knobs = self.knobs
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

    def _start_announcing(self) -> None:
        """The announcer: every KEEP_TIME_SECONDS it brings the units up to date, as a provider
        notices a batch's end whether anyone asks or not, and posts the webhooks of those that
        ended. Started while the emulator serves (from a thread of a test or from `run_emulator`)
        with a `webhook_url` set."""
        if self._announcer is not None:
            return
        self._announcer_stop.clear()
        self._announcer = threading.Thread(
            target=self._announce, name=f"emulator-{self.protocol}-webhooks", daemon=True
        )
        self._announcer.start()

    def _stop_announcing(self) -> None:
        if self._announcer is not None:
            self._announcer_stop.set()
            self._announcer.join()
            self._announcer = None

    def _announce(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._announcer_stop.wait(KEEP_TIME_SECONDS):
                with self.lock:
                    self.advance()
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
        with self.lock:
            self._webhooks.append(
                {
                    "id": webhook.message_id,
                    "type": webhook.event_type,
                    "unit": webhook.unit,
                    "sent_at": sent_at,
                    "answers": answers,
                }
            )

    # --- one call ----------------------------------------------------------------------------

    def _control_rules(self) -> list[Rule]:
        return [
            Rule("/_emulator/stats", endpoint="_control_stats", methods=["GET"]),
            Rule("/_emulator/config", endpoint="_control_show_config", methods=["GET"]),
            Rule("/_emulator/config", endpoint="_control_configure", methods=["POST"]),
        ]

    def _control_stats(self, request: Request) -> dict:
        return self.stats()

    def _control_show_config(self, request: Request) -> dict:
        return self.config()

    def _control_configure(self, request: Request) -> dict:
        knobs = self.json_body(request)
        if not isinstance(knobs, dict):
            names = ", ".join(knob.name for knob in fields(self.knobs_class))
            raise self.error(400, f"Expected a JSON object of knobs: {names}.")
        return self.configure(**knobs)

    def admit(self, method: str, path: str) -> None:
        """Count one API call, and refuse it (429, a server error, then a permanent error) while a
        knob says so."""
        with self.lock:
            knobs = self.knobs
            if self.create_rule and method == self.create_rule[0] and re.fullmatch(self.create_rule[1], path):
                self._creates += 1
                if knobs.billing_refusals:
                    knobs.billing_refusals -= 1
                    self._rejected_calls += 1
                    raise self.billing_refusal()
            if knobs.rate_limit_calls and _matches(knobs.rate_limit_path, method, path):
                knobs.rate_limit_calls -= 1
                self._rejected_calls += 1
                wait = seconds_text(knobs.retry_after)
                raise self.error(
                    429,
                    f"Rate limit reached on the {self.protocol} emulator. Please try again in {wait}s.",
                    kind="rate_limit",
                    headers={"retry-after": wait},
                )
            if knobs.server_errors and _matches(knobs.server_error_path, method, path):
                knobs.server_errors -= 1
                self._rejected_calls += 1
                status = knobs.server_error_status
                raise self.error(
                    status,
                    "The server had an error while processing your request.",
                    kind="overloaded" if status in (503, 529) else "server_error",
                )
            if knobs.refusals and _matches(knobs.refusal_path, method, path):
                knobs.refusals -= 1
                self._rejected_calls += 1
                status = knobs.refusal_status
                kind = {401: "authentication", 403: "authentication", 404: "not_found"}.get(
                    status, "invalid_request"
                )
                raise self.error(
                    status, f"The {self.protocol} emulator refuses this call ({status}).", kind=kind
                )

    def wsgi_app(self, environ: dict, start_response: Callable) -> Any:
        request = Request(environ)
        request.max_content_length = MAX_BODY_BYTES
        try:
            response = self._answer(request)
        except LoseAnswer:
            self._hang_up(environ)
            response = Response(b"", status=500)  # never reaches the client: the socket is gone
        for name, value in self.answer_headers().items():
            response.headers.setdefault(name, value)
        return response(environ, start_response)

    def _answer(self, request: Request) -> Response:
        adapter = self._url_map.bind_to_environ(request.environ)
        try:
            try:
                endpoint, values = adapter.match()
            except HTTPException as exc:
                raise self.error(
                    exc.code or 404,
                    f"Invalid URL ({request.method} {request.path})",
                    kind="not_found" if exc.code == 404 else "invalid_request",
                ) from None
            if request.path.startswith(self.api_prefix):
                self.authenticate(request)
                # The control endpoints are never refused: they turn faults off.
                self.admit(request.method, request.path)
            result = getattr(self, endpoint)(request, **values)
        except ApiError as error:
            return Response(
                json.dumps(error.body),
                status=error.status,
                headers=error.headers,
                mimetype="application/json",
            )
        except LoseAnswer:
            raise
        except Exception:
            log.exception("%s emulator failed on %s %s", self.protocol, request.method, request.path)
            error = self.error(500, "Emulator error.", kind="server_error")
            return Response(json.dumps(error.body), status=500, mimetype="application/json")
        if isinstance(result, Response):
            return result
        if isinstance(result, Download):
            return self._download_response(request, result)
        return Response(json.dumps(result), mimetype="application/json")

    def _download_response(self, request: Request, download: Download) -> Response:
        """Stream the bytes in slices; with `cut_at`, announce all of them but hang up part-way."""
        content, cut_at = download.content, download.cut_at
        environ = request.environ

        def body() -> Iterator[bytes]:
            view = memoryview(content)[:cut_at]
            for start in range(0, len(view), 64 * 1024):
                yield bytes(view[start : start + 64 * 1024])
            if cut_at is not None:
                self._hang_up(environ)

        response = Response(body(), mimetype=download.content_type, direct_passthrough=True)
        response.headers["Content-Length"] = str(len(content))
        return response

    @staticmethod
    def _hang_up(environ: dict) -> None:
        """Drop the connection without (the rest of) an answer: the client sees a transport error."""
        connection = environ.get("werkzeug.socket")
        if connection is not None:
            with contextlib.suppress(OSError):  # the client may have left first
                connection.shutdown(socket.SHUT_RDWR)
