"""A self-hosted OpenAI-compatible server (vLLM, llama.cpp, Ollama) called request by request
(reference/providers.md §5): `POST {base}/chat/completions`, at most `concurrency` in flight.

Such a server has no batch to create and nowhere to keep answers, so a unit lives here: `submit`
only names it (no call is made, so no answer can be lost), `status` says it is ready, and the
requests are made inside `results`, which yields each answer the moment it arrives. The ledger
records each line at once, so a worker killed part-way loses only the requests in flight, and
the next `results` call skips every custom_id already recorded.

The server is a neighbour: a 429 is the server asking us to slow down, not a failure of the
request. It pauses every call of the unit for as long as the server asks (`requested_wait`:
`retry-after-ms`, `Retry-After`, a LiteLLM gateway's `llm_provider-retry-after`, OpenAI's
`x-ratelimit-reset-*`), or for a pause that doubles from FIRST_PAUSE up to LONGEST_PAUSE when it does not
say, and halves how many requests are in flight; the request is asked again. A round starts with
one request in flight and adds one after as many answers in a row, so a unit taken up again after
a slow-down (or a refusal) costs the server one call to find out. A pause that would keep a
worker waiting more than ROUND_PAUSE_BUDGET ends the round with `SlowDown`: the unit then waits in
the ledger, not in a worker.

A refusal of the unit is not a failure of its requests: a refused key (401, 403), and a refusal
that meets every request alike (the same status, code and words, before any other answer: a LiteLLM
proxy without a database answers each request 400 "No connected db."; `FirstAnswers` says when)
end the round with a permanent ProviderError, so the ledger pauses the unit as it pauses a batch the
provider refuses, for as long (`refused_for_good`); none of its requests fails. A refusal among
other answers is that request's own, and fails it for good.
"""

import json
import threading
import time
from collections import deque
from collections.abc import Container, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime

import httpx

from ..drafts.schema_dialects import Dialect
from ..drafts.scrubbing import scrub_credentials
from ..retrying import requested_wait
from ..states import ReasonCode
from . import base
from .http import (
    NEVER_SENT,
    PARSE_ERRORS,
    HttpBatchProvider,
    configured_key,
    loads,
    provider_client,
    unreadable_result,
)
from .openai import chat_body, read_completion

PATH = "/chat/completions"
REF_PREFIX = "local-"
# Our custom_id travels in this header, so the server's logs (vLLM with
# --enable-request-id-headers uses it as its own request id) and the emulator tell requests apart.
REQUEST_ID_HEADER = "X-Request-Id"
DEFAULT_CONCURRENCY = 4
# A slow server may think for a long time before its first byte; a request that takes longer
# than this is a transient timeout of that request, not of the unit.
READ_TIMEOUT = 120.0
# A 429 that does not say how long to wait pauses the unit this long, doubled at each 429 in a
# row, up to LONGEST_PAUSE: most servers count requests per minute (vLLM behind a proxy, LiteLLM's
# rpm, nginx's limit_req), so a minute's pause always reaches a fresh window, and a longer one
# would leave the allowance unused.
FIRST_PAUSE = 1.0
LONGEST_PAUSE = 60.0
# A round waits out pauses up to this long in all; the pause that would take it further ends the
# round (`SlowDown`), and the unit waits in the ledger until that pause is over.
ROUND_PAUSE_BUDGET = 60.0
# Answers that mean our key is refused: the whole unit waits, no request fails.
KEY_REFUSED = (401, 403)
# The same refusal met by this many requests in a row, before any other answer, is the server
# refusing the unit: nothing more is sent. A round of fewer requests, every one refused alike, two
# at least, is refused too; one request alone cannot tell, and its refusal is its own.
REFUSALS_ALIKE = 3
# What the server refuses when it refuses the unit, the first words of its ProviderError, read
# back by `Submission.refusal` ("The server refuses our requests since …: No connected db.").
KEY_REFUSED_WORDS = "The server refuses our key"
REQUESTS_REFUSED_WORDS = "The server refuses our requests"


def request_body(request: base.InferenceRequest, schema_dialect: str = Dialect.OPENAI_STRICT) -> dict:
    # `max_tokens`, not `max_completion_tokens`: every compatible server reads it.
    return chat_body(request, max_tokens_key="max_tokens", dialect=schema_dialect)


class SlowDown(base.ProviderError):
    """The server asks us (429) to wait longer than a worker should: the unit is asked again
    `retry_after` seconds from now. None of its requests failed."""

    def __init__(self, message: str, *, retry_after: float, secrets: Iterable[str] = ()):
        super().__init__(message, status=429, retry_after=retry_after, secrets=secrets)


class _Unreachable(Exception):
    """The server could not be reached for one request: stop sending and end this round."""


class _UnitRefused(Exception):
    """The server refuses the unit (our key, or every request alike): stop sending and end this
    round; no request is failed by it."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class _TooManyRequests(Exception):
    """The server answered 429: the request is asked again after the pause. `wait`: what the
    server asked for, in seconds (None: it did not say)."""

    def __init__(self, wait: float | None):
        super().__init__(f"429, wait {wait}")
        self.wait = wait


class Pace:
    """How fast one round sends a unit's requests, shared by its concurrent calls: how many may be
    in flight, and when the next may leave (a 429 pauses them all)."""

    def __init__(self, concurrency: int):
        self.concurrency = concurrency
        self.in_flight = 1  # one to begin with: the server may be refusing or slowing us already
        self.answered_in_a_row = 0
        self.not_before = 0.0  # time.monotonic() before which nothing is sent
        self.pauses_in_a_row = 0  # 429s in a row (each pause at least twice the one before)
        self.paused = 0.0  # seconds of pause this round has been asked for
        self.slowed = False  # the server asked us to slow down this round

    def answered(self) -> None:
        """The server took a request (whatever it answered): one more in flight after as many
        answers in a row as are in flight now, until the server first asks us to slow down (the
        next round starts again from one)."""
        self.pauses_in_a_row = 0
        self.answered_in_a_row += 1
        if self.answered_in_a_row >= self.in_flight and self.in_flight < self.concurrency and not self.slowed:
            self.in_flight += 1
            self.answered_in_a_row = 0

    def slow_down(self, wait: float | None) -> None:
        """A 429. Answers to requests sent before the pause began belong to the same slow-down:
        they do not halve or double again, but a longer wait the server asks for is kept."""
        now = time.monotonic()
        pausing = now < self.not_before
        self.answered_in_a_row = 0
        if wait is None and pausing:
            return
        # The wait the server asks for, but never less than the backoff: a server asking for none
        # ("Retry-After: 0", a time already past) would otherwise be asked again at once, for ever.
        backoff = min(FIRST_PAUSE * 2**self.pauses_in_a_row, LONGEST_PAUSE)
        wait = backoff if wait is None else max(wait, backoff)
        if not pausing:
            self.pauses_in_a_row += 1
            self.in_flight = max(1, self.in_flight // 2)
        self.slowed = True
        until = max(self.not_before, now + wait)
        self.paused += until - max(self.not_before, now)
        self.not_before = until

    def waiting(self) -> float:
        """Seconds until the next request may leave."""
        return max(0.0, self.not_before - time.monotonic())

    def worn_out(self) -> bool:
        """Whether this round has been asked to pause more than a worker should wait."""
        return self.paused > ROUND_PAUSE_BUDGET


def refusal_of_the_request(line: base.ResultLine) -> bool:
    """Whether the server refused the request with a permanent HTTP error (a 4xx but 408 and 429)."""
    status = line.http_status
    return not line.succeeded and not line.transient and status is not None and 400 <= status < 500


class FirstAnswers:
    """A round's answers until one shows that the server serves this unit. Until then a request's
    refusal is held back, neither yielded nor recorded: when REFUSALS_ALIKE requests (or every
    request of a smaller round, two at least) meet the same refusal, the refusal is the unit's
    (`unit_refusal`), and the held requests are asked again once the unit's pause is over. Any
    other answer (a draft, a transient failure, another refusal) releases what was held: each
    refusal is then its own request's, and so is every later one."""

    def __init__(self):
        self.held: list[base.ResultLine] = []
        self.served = False

    def take(self, line: base.ResultLine) -> list[base.ResultLine]:
        """The lines that may be yielded now that `line` has arrived."""
        if self.served:
            return [line]
        if refusal_of_the_request(line) and (not self.held or self.alike(self.held[0], line)):
            self.held.append(line)
            return []
        if self.unit_refusal() is not None:
            return [line]  # the unit is refused already: what was held stays unrecorded
        self.served = True
        released, self.held = [*self.held, line], []
        return released

    def unit_refusal(self, *, every_request_answered: bool = False) -> base.ResultLine | None:
        """The refusal the unit met, or None while (or since) it may be the requests' own.
        `every_request_answered`: the round has nothing more to ask."""
        enough = REFUSALS_ALIKE if not every_request_answered else 2
        return self.held[0] if len(self.held) >= enough else None

    @staticmethod
    def alike(one: base.ResultLine, other: base.ResultLine) -> bool:
        return (one.http_status, one.error_code, one.error_message) == (
            other.http_status,
            other.error_code,
            other.error_message,
        )


class CompatibleServerProvider(HttpBatchProvider):
    name = "openai_compatible"
    schema_dialect = Dialect.OPENAI_STRICT  # unless OPENAI_COMPATIBLE_SCHEMA says as_is
    capabilities = base.Capabilities(
        # `submit` makes no call, so there is never a lost create answer to look for.
        finding=base.Finding.NOT_AT_ALL,
        # Nothing waits at the server between calls; requests are made only inside `results`.
        can_cancel=False,
        # One unit is collected by one worker task (300 s before it is killed). At 4 in flight
        # and ~4 s a draft on a modest GPU, 200 requests take ~200 s. A task killed part-way
        # loses only the requests in flight, so this bounds the waste, not correctness.
        max_requests=200,
        # Requests are sent one by one: a unit has no payload of its own to limit.
        max_bytes=1 << 30,
        delivery=base.Delivery.PER_REQUEST,
    )

    def __init__(
        self,
        *,
        client: httpx.Client,
        concurrency: int = DEFAULT_CONCURRENCY,
        schema_dialect: str = Dialect.OPENAI_STRICT,
    ):
        super().__init__(client=client)
        self.concurrency = max(1, int(concurrency))
        # OPENAI_COMPATIBLE_SCHEMA: OpenAI's strict dialect (what LiteLLM and OpenAI-like gateways
        # pass on), or the schema as it is for a server that takes the whole of JSON Schema (vLLM).
        self.schema_dialect = Dialect(schema_dialect)

    @classmethod
    def from_settings(cls, config: dict) -> "CompatibleServerProvider":
        concurrency = int(config.get("concurrency") or DEFAULT_CONCURRENCY)
        api_key = configured_key(config)
        # Most self-hosted servers take no key; one is sent only when configured.
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        client = provider_client(config, headers=headers, read_timeout=READ_TIMEOUT, limits=limits)
        return cls(client=client, concurrency=concurrency, schema_dialect=config["schema_dialect"])

    def request_bytes(self, request: base.InferenceRequest) -> int:
        return len(json.dumps(request_body(request, self.schema_dialect), ensure_ascii=False).encode("utf-8"))

    def submit(self, *, requests: list[base.InferenceRequest], intent_key: str, metadata: dict) -> str:
        """Name the unit; nothing is sent until `results`."""
        return f"{REF_PREFIX}{intent_key}"

    def find_units(self, *, intent_key: str, sent_at: datetime, request_count: int) -> list[str]:
        # Never needed (`submit` cannot lose an answer), but the answer is certain: the reference
        # is made from the intent key alone.
        return [f"{REF_PREFIX}{intent_key}"]

    def status(self, provider_ref: str) -> base.UnitStatus:
        return base.UnitStatus(provider_status="ready", ended=True)

    def cancel(self, provider_ref: str) -> str:
        """Nothing is queued at the server: a unit whose results are never asked for costs nothing."""
        return "ready"

    def results(
        self, provider_ref: str, *, skip: Container[str] = (), requests: Iterable[base.InferenceRequest] = ()
    ) -> base.Results:
        """Ask the server for each request not in `skip`, as fast as the round's `Pace` allows and
        never more than `concurrency` at a time, and yield each answer as it arrives. What arrived
        is yielded before a round that ends early raises: a transient ProviderError if the server
        cannot be reached, `SlowDown` if it asks us to wait longer than a worker should, a
        permanent ProviderError if it refuses the unit (our key, or every request alike:
        `FirstAnswers`). Closing the generator stops sending at once; requests already in flight
        end within the client's timeout."""
        # `skip` is read just before each request is sent, not once: a container that reads the
        # ledger keeps a request recorded meanwhile (by another worker) from being paid twice.
        pending = (r for r in requests if r.custom_id not in skip)
        again: deque[base.InferenceRequest] = deque()  # answered 429: asked again before the others

        def next_request() -> base.InferenceRequest | None:
            while again:
                request = again.popleft()
                if request.custom_id not in skip:
                    return request
            return next(pending, None)

        pace = Pace(self.concurrency)
        stop = threading.Event()
        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="compatible-server")
        in_flight: dict[Future, base.InferenceRequest] = {}
        first = FirstAnswers()
        ended: _Unreachable | _UnitRefused | None = None
        try:
            while True:
                while (
                    ended is None
                    and not pace.worn_out()
                    and len(in_flight) < pace.in_flight
                    and not pace.waiting()
                ):
                    request = next_request()
                    if request is None:
                        break
                    in_flight[pool.submit(self._ask, request, stop)] = request
                if not in_flight:
                    request = None if ended is not None else next_request()
                    if request is None:
                        break
                    again.appendleft(request)
                    if pace.worn_out():
                        raise SlowDown(
                            f"The server asked us to slow down (HTTP 429) for {pace.paused:.0f} s "
                            "this round; its requests are asked again after the pause",
                            retry_after=pace.waiting(),
                            secrets=self.secrets,
                        )
                    time.sleep(pace.waiting())  # the whole unit's pause: nothing is in flight
                    continue
                done, _ = wait(in_flight, timeout=pace.waiting() or None, return_when=FIRST_COMPLETED)
                lines, broken = [], []
                for future in done:
                    request = in_flight.pop(future)
                    try:
                        line = future.result()
                    except _TooManyRequests as exc:
                        # Not a failure of the request: the server asks for time; it is asked again.
                        pace.slow_down(exc.wait)
                        again.append(request)
                        continue
                    except (_Unreachable, _UnitRefused) as exc:
                        ended = ended or exc
                        continue
                    except Exception as exc:  # noqa: BLE001 - a fault of ours, after the request was sent
                        # It may have been answered (and paid for): a permanent failure of that
                        # request, never a re-send, and never the end of the answers beside it.
                        broken.append(
                            unreadable_result(
                                request.custom_id,
                                f"the answer could not be handled: {type(exc).__name__}: {exc}",
                                secrets=self.secrets,
                            )
                        )
                        continue
                    if line is not None:
                        pace.answered()
                        lines.extend(first.take(line))
                        refused = first.unit_refusal()
                        if ended is None and refused is not None:
                            ended = self._requests_refused(refused, len(first.held))
                # Every readable answer first: each is recorded the moment it is yielded.
                yield from lines
                yield from broken
            if ended is None:
                refused = first.unit_refusal(every_request_answered=True)
                if refused is not None:
                    ended = self._requests_refused(refused, len(first.held))
                else:
                    yield from first.held  # one request alone: its refusal is its own
            if ended is not None:
                raise base.ProviderError(
                    str(ended), status=getattr(ended, "status", None), secrets=self.secrets
                )
        finally:
            stop.set()
            pool.shutdown(wait=False, cancel_futures=True)

    def _ask(self, request: base.InferenceRequest, stop: threading.Event) -> base.ResultLine | None:
        """One request. None: the round stopped before it was sent, so nothing is recorded and it
        is asked again next round. A 429 or a refused key is raised, never a line: neither says
        anything about this request."""
        if stop.is_set():
            return None
        try:
            response = self.client.post(
                PATH,
                json=request_body(request, self.schema_dialect),
                headers={REQUEST_ID_HEADER: request.custom_id},
            )
        except (*NEVER_SENT, httpx.InvalidURL) as exc:
            # Never left this machine: the server is not there, so nothing more is sent this
            # round (the unit is collected again later), rather than failing every item.
            raise _Unreachable(f"POST {PATH} could not be sent: {exc}") from exc
        except httpx.TimeoutException as exc:
            return self._failure(request, ReasonCode.TIMED_OUT, True, "timeout", f"no answer in time: {exc}")
        except httpx.DecodingError as exc:
            # Answered (and computed) but the body cannot be decoded: permanent, never re-sent.
            return self._failure(
                request,
                ReasonCode.UNREADABLE_RESULT,
                False,
                "unreadable_result",
                f"an answer that could not be decoded: {exc}",
            )
        except httpx.HTTPError as exc:
            # Sent, perhaps answered by the model, but the answer never arrived.
            return self._failure(
                request,
                ReasonCode.MODEL_SERVER_ERROR,
                True,
                "connection_lost",
                f"the answer was lost: {exc}",
            )
        if response.status_code == 429:
            raise _TooManyRequests(requested_wait(response.headers))
        if response.status_code in KEY_REFUSED:
            said = self._error_line(request, response)  # the server's code and words, scrubbed
            raise _UnitRefused(
                f"{KEY_REFUSED_WORDS}: POST {PATH} answered {response.status_code} "
                f"{said.error_code}: {said.error_message}",
                response.status_code,
            )
        return self._read(request, response)

    @staticmethod
    def _requests_refused(said: base.ResultLine, requests: int) -> _UnitRefused:
        """The unit refused: `requests` in a row met the refusal `said` (its words scrubbed already)."""
        status = said.http_status
        code = "" if said.error_code in (str(status), f"http_{status}") else f" {said.error_code}"
        return _UnitRefused(
            f"{REQUESTS_REFUSED_WORDS}: {said.error_message or '(no words)'} "
            f"(POST {PATH} answered {status}{code} to {requests} requests in a row)",
            status,
        )

    def _read(self, request: base.InferenceRequest, response: httpx.Response) -> base.ResultLine:
        try:
            return self._read_answer(request, response)
        except PARSE_ERRORS as exc:
            return unreadable_result(
                request.custom_id,
                f"an answer that could not be read ({type(exc).__name__}: {exc})",
                http_status=response.status_code,
                secrets=self.secrets,
            )

    def _read_answer(self, request: base.InferenceRequest, response: httpx.Response) -> base.ResultLine:
        if response.status_code >= 400:
            return self._error_line(request, response)
        try:
            # Read as OpenAI's own adapter reads a completion: a draft, cut off or not, or a refusal.
            line = read_completion(
                request.custom_id,
                loads(response.text),
                http_status=response.status_code,
                secrets=self.secrets,
            )
            if line is None:
                raise TypeError("content is not text")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            # Answered (and computed) but unusable: permanent, never re-sent by itself.
            said = scrub_credentials(response.text, self.secrets)[:300]
            return self._failure(
                request,
                ReasonCode.UNREADABLE_RESULT,
                False,
                "unreadable_result",
                f"an answer without a text choices[0].message.content: {said}",
                http_status=response.status_code,
            )
        return line

    def _error_line(self, request: base.InferenceRequest, response: httpx.Response) -> base.ResultLine:
        """An HTTP error, classified by its status; the server's own code and message are kept."""
        reason, transient = base.classify_http_status(response.status_code)
        try:
            answer = response.json()
        except ValueError:
            answer = None
        answer = answer if isinstance(answer, dict) else {}
        # OpenAI's `{"error": {...}}`; older vLLM puts the same keys at the top level; Ollama may
        # answer `{"error": "text"}`; a proxy, plain text.
        envelope = answer.get("error", answer if "message" in answer else None)
        if isinstance(envelope, dict):
            code = envelope.get("code")  # llama.cpp and vLLM put the HTTP status here, as a number
            code = code if isinstance(code, str) and code else envelope.get("type")
            code = str(code or f"http_{response.status_code}")
            message = str(envelope.get("message") or "")
        else:
            code = f"http_{response.status_code}"
            message = str(envelope) if envelope else response.text
        return self._failure(
            request,
            reason,
            transient,
            code,
            message,
            http_status=response.status_code,
            # A 503 (or 408) may say when the request is worth asking again, as a 429 does.
            retry_after=requested_wait(response.headers) if transient else None,
        )

    def _failure(
        self,
        request: base.InferenceRequest,
        reason: str,
        transient: bool,
        code: str,
        message: str,
        *,
        http_status: int | None = None,
        retry_after: float | None = None,
    ) -> base.ResultLine:
        return base.ResultLine(
            custom_id=request.custom_id,
            succeeded=False,
            http_status=http_status,
            error_code=code,
            # Scrubbed before it is cut short: half a key would no longer look like one.
            error_message=scrub_credentials(message, self.secrets)[:1000],
            reason=reason,
            transient=transient,
            retry_after=retry_after,
        )
