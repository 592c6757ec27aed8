"""What every protocol emulator shares: a threaded HTTP server (Werkzeug's), routing (Werkzeug's
rules), request bodies and multipart forms (Werkzeug's parser), the control endpoints
(`GET /_emulator/stats`, `GET|POST /_emulator/config`), the common fault knobs, and the faults
that happen before a call reaches the protocol: 429 and 5xx storms, lost answers, cut downloads.

A protocol subclasses `EmulatorServer` and supplies its routes, its error envelope, its
credential check and its evidence (what it was asked and did). Everything that involves chance
is drawn from the seed (`spoiling.dice`), so a run is reproducible.
"""

import contextlib
import json
import logging
import re
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any, ClassVar, NamedTuple

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

from ledger.emulators import spoiling
from ledger.emulators.clock import Clock, WallClock
from ledger.emulators.knobs import FaultKnobs, KnobError, knob_names, matches, parse
from ledger.emulators.webhooks import KEEP_TIME_SECONDS, Announcer

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


class Fault(NamedTuple):
    """An error before a protocol words it (`EmulatorServer.envelope`). `kind`: invalid_request,
    authentication, not_found, rate_limit, server_error or overloaded (a protocol may know more);
    `code` and `param` as the protocol's envelope carries them, when it does."""

    status: int
    message: str
    kind: str
    code: Any
    param: str | None
    headers: dict[str, str]


class Download(NamedTuple):
    """A file's bytes, and where to hang up if a fault knob cuts this download short."""

    content: bytes
    cut_at: int | None = None
    content_type: str = "application/octet-stream"


def seconds_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


# The control endpoints every emulator serves beside its protocol (never refused: they turn faults off).
CONTROL_ROUTES = (
    "GET /_emulator/stats _control_stats",
    "GET /_emulator/config _control_show_config",
    "POST /_emulator/config _control_configure",
)


def _rule(route: str) -> Rule:
    """A route written "METHOD /path endpoint" as Werkzeug's rule."""
    method, path, endpoint = route.split()
    return Rule(path, endpoint=endpoint, methods=[method])


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
    # The protocol's calls, each "METHOD /path endpoint": the method of this class that answers it.
    routes: ClassVar[tuple[str, ...]] = ()

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
        self.webhooks = Announcer(
            name=f"emulator-{self.protocol}-webhooks", lock=self.lock, advance=self.advance
        )
        self._url_map = Map([_rule(route) for route in self.routes + CONTROL_ROUTES], strict_slashes=False)
        self.configure(**knobs)  # a bad knob raises ApiError: nothing serves

    # --- what a protocol supplies ------------------------------------------------------------

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

    def envelope(self, fault: Fault) -> ApiError:
        """`fault` in the protocol's error envelope."""
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

    def advance_a_little(self) -> bool:
        """Part of `advance` (called under the lock); True while more is left to do. A protocol whose
        units take long to bring up to date does it a part at a time, so that a call waiting for the
        lock (an upload, a poll) waits for a part, not for every unit's whole run."""
        self.advance()
        return False

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
            self.webhooks.start()
        return self.base_url

    def stop(self) -> None:
        self.webhooks.stop()
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
            self.webhooks.start()
        if on_ready is not None:
            on_ready(self.base_url)
        try:
            server.serve_forever()
        finally:
            stop.set()
            self.webhooks.stop()
            server.server_close()

    def keep_time(self, stop: threading.Event, every: float = KEEP_TIME_SECONDS) -> None:
        """Bring every unit up to date every `every` seconds until `stop` is set, as a provider
        works on a batch whether anyone asks or not: a unit's results are written while the
        workers do other things, not while the first poll after its end waits for them. What a
        unit becomes, and when, is the same either way (it follows from its timestamps)."""
        while not stop.wait(every):
            more = True
            while more and not stop.is_set():
                with self.lock:
                    more = self.advance_a_little()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- knobs and evidence ----------------------------------------------------------------

    def configure(self, **knobs: Any) -> dict:
        """Change some of the knobs; returns all of them. Nothing changes if one is invalid."""
        try:
            checked = parse(self.knobs_class, knobs)
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
                self.webhooks.start()
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
                "webhooks": [dict(sent) for sent in self.webhooks.sent],
            }

    # --- helpers for protocols ---------------------------------------------------------------

    def error(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request",
        code: Any = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> ApiError:
        """An error answered in the protocol's envelope (see `Fault`)."""
        return self.envelope(Fault(status, message, kind, code, param, headers or {}))

    def chance(self, rate: float, *parts: Any) -> bool:
        """Whether the request `parts` name draws a fault at `rate` (`spoiling.chance`)."""
        return spoiling.chance(self.seed, rate, *parts)

    def answer_shape(self, *parts: Any) -> str:
        """How the model answers the request `parts` name (`spoiling.answer_shape`)."""
        return spoiling.answer_shape(self.knobs, self.seed, *parts)

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
                return Download(content, spoiling.mid_line(content), content_type)
            return Download(content, None, content_type)

    def json_body(self, request: Request) -> Any:
        try:
            return json.loads(request.get_data() or b"null")
        except ValueError:
            raise self.error(400, "The request body is not valid JSON.") from None

    # --- one call ----------------------------------------------------------------------------

    def _control_stats(self, request: Request) -> dict:
        return self.stats()

    def _control_show_config(self, request: Request) -> dict:
        return self.config()

    def _control_configure(self, request: Request) -> dict:
        knobs = self.json_body(request)
        if not isinstance(knobs, dict):
            raise self.error(400, f"Expected a JSON object of knobs: {knob_names(self.knobs_class)}.")
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
            if knobs.rate_limit_calls and matches(knobs.rate_limit_path, method, path):
                knobs.rate_limit_calls -= 1
                self._rejected_calls += 1
                wait = seconds_text(knobs.retry_after)
                raise self.error(
                    429,
                    f"Rate limit reached on the {self.protocol} emulator. Please try again in {wait}s.",
                    kind="rate_limit",
                    headers={"retry-after": wait},
                )
            if knobs.server_errors and matches(knobs.server_error_path, method, path):
                knobs.server_errors -= 1
                self._rejected_calls += 1
                status = knobs.server_error_status
                raise self.error(
                    status,
                    "The server had an error while processing your request.",
                    kind="overloaded" if status in (503, 529) else "server_error",
                )
            if knobs.refusals and matches(knobs.refusal_path, method, path):
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
