"""A self-hosted OpenAI-compatible server (vLLM, llama.cpp, Ollama) called request by request
(reference/providers.md §5): `POST {base}/chat/completions`, at most `concurrency` in flight.

Such a server has no batch to create and nowhere to keep answers, so a unit lives here: `submit`
only names it (no call is made, so no answer can be lost), `status` says it is ready, and the
requests are made inside `results`, which yields each answer the moment it arrives. The ledger
records each line at once, so a worker killed part-way loses only the requests in flight, and
the next `results` call skips every custom_id already recorded.
"""

import json
import os
import threading
from collections.abc import Container, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime

import httpx

from ..retrying import retry_after_seconds
from ..scrubbing import scrub_credentials
from ..states import ReasonCode
from .base import (
    Capabilities,
    Delivery,
    Finding,
    InferenceRequest,
    ProviderError,
    ResultLine,
    UnitStatus,
    UnreadableLine,
    classify_http_status,
    tls_context,
)
from .http import NEVER_SENT, PARSE_ERRORS, HttpBatchProvider, loads, unreadable_result
from .openai import read_completion

PATH = "/chat/completions"
REF_PREFIX = "local-"
# Our custom_id travels in this header, so the server's logs (vLLM with
# --enable-request-id-headers uses it as its own request id) and the emulator tell requests apart.
REQUEST_ID_HEADER = "X-Request-Id"
DEFAULT_CONCURRENCY = 4
# A slow server may think for a long time before its first byte; a request that takes longer
# than this is a transient timeout of that request, not of the unit.
READ_TIMEOUT = 120.0
# 429 is answered inside the call: wait Retry-After (never more than this), and try again at
# most this many times before the request is handed back as a transient `rate_limited` line.
MAX_RATE_LIMIT_WAIT = 30.0
RATE_LIMIT_RETRIES = 3


def request_body(request: InferenceRequest) -> dict:
    body = {
        "model": request.model,
        "messages": [
            {"role": "system", "content": request.system_message},
            {"role": "user", "content": request.user_message},
        ],
        # `max_tokens`, not `max_completion_tokens`: every compatible server reads it.
        "max_tokens": request.max_output_tokens,
    }
    if request.output_schema:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": request.output_schema, "strict": True},
        }
    return body


class _Unreachable(Exception):
    """The server could not be reached for one request: stop sending and end this round."""


class CompatibleServerProvider(HttpBatchProvider):
    name = "openai_compatible"
    capabilities = Capabilities(
        # `submit` makes no call, so there is never a lost create answer to look for.
        finding=Finding.NOT_AT_ALL,
        # Nothing waits at the server between calls; requests are made only inside `results`.
        can_cancel=False,
        # One unit is collected by one worker task (300 s before it is killed). At 4 in flight
        # and ~4 s a draft on a modest GPU, 200 requests take ~200 s. A task killed part-way
        # loses only the requests in flight, so this bounds the waste, not correctness.
        max_requests=200,
        # Requests are sent one by one: a unit has no payload of its own to limit.
        max_bytes=1 << 30,
        delivery=Delivery.PER_REQUEST,
    )

    def __init__(self, *, client: httpx.Client, concurrency: int = DEFAULT_CONCURRENCY):
        super().__init__(client=client)
        self.concurrency = max(1, int(concurrency))

    @classmethod
    def from_settings(cls, config: dict) -> "CompatibleServerProvider":
        concurrency = int(config.get("concurrency") or DEFAULT_CONCURRENCY)
        api_key = os.environ.get(config["api_key_env"], "")
        # Most self-hosted servers take no key; one is sent only when configured.
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        client = httpx.Client(
            base_url=config["base_url"],
            verify=tls_context(),
            headers=headers,
            timeout=httpx.Timeout(READ_TIMEOUT, connect=10.0),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        )
        return cls(client=client, concurrency=concurrency)

    def request_bytes(self, request: InferenceRequest) -> int:
        return len(json.dumps(request_body(request), ensure_ascii=False).encode("utf-8"))

    def submit(self, *, requests: list[InferenceRequest], intent_key: str, metadata: dict) -> str:
        """Name the unit; nothing is sent until `results`."""
        return f"{REF_PREFIX}{intent_key}"

    def find_units(self, *, intent_key: str, sent_at: datetime, request_count: int) -> list[str]:
        # Never needed (`submit` cannot lose an answer), but the answer is certain: the reference
        # is made from the intent key alone.
        return [f"{REF_PREFIX}{intent_key}"]

    def status(self, provider_ref: str) -> UnitStatus:
        return UnitStatus(provider_status="ready", ended=True)

    def cancel(self, provider_ref: str) -> str:
        """Nothing is queued at the server: a unit whose results are never asked for costs nothing."""
        return "ready"

    def results(
        self,
        provider_ref: str,
        *,
        skip: Container[str] = (),
        requests: Iterable[InferenceRequest] = (),
    ) -> Iterator[ResultLine | UnreadableLine]:
        """Ask the server for each request not in `skip`, at most `concurrency` at a time, and
        yield each answer as it arrives. If the server cannot be reached, what arrived is
        yielded and a transient ProviderError ends the round. Closing the generator stops
        sending at once; requests already in flight end within the client's timeout."""
        # `skip` is read just before each request is sent, not once: a container that reads the
        # ledger keeps a request recorded meanwhile (by another worker) from being paid twice.
        pending = (r for r in requests if r.custom_id not in skip)
        stop = threading.Event()
        pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="compatible-server")
        in_flight: dict[Future, InferenceRequest] = {}
        unreachable: _Unreachable | None = None
        try:
            while True:
                while unreachable is None and len(in_flight) < self.concurrency:
                    request = next(pending, None)
                    if request is None:
                        break
                    in_flight[pool.submit(self._ask, request, stop)] = request
                if not in_flight:
                    break
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                lines, broken = [], []
                for future in done:
                    request = in_flight.pop(future)
                    try:
                        line = future.result()
                    except _Unreachable as exc:
                        unreachable = unreachable or exc
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
                        lines.append(line)
                # Every readable answer first: each is recorded the moment it is yielded.
                yield from lines
                yield from broken
            if unreachable is not None:
                raise ProviderError(str(unreachable), secrets=self.secrets)
        finally:
            stop.set()
            pool.shutdown(wait=False, cancel_futures=True)

    def _ask(self, request: InferenceRequest, stop: threading.Event) -> ResultLine | None:
        """One request, with 429 waited out a bounded number of times. None: stopped while
        waiting, so nothing is recorded and the request is asked again next round."""
        body = request_body(request)
        headers = {REQUEST_ID_HEADER: request.custom_id}
        for attempt in range(RATE_LIMIT_RETRIES + 1):
            if stop.is_set():
                return None
            try:
                response = self.client.post(PATH, json=body, headers=headers)
            except (*NEVER_SENT, httpx.InvalidURL) as exc:
                # Never left this machine: the server is not there, so nothing more is sent this
                # round (the unit is collected again later), rather than failing every item.
                raise _Unreachable(f"POST {PATH} could not be sent: {exc}") from exc
            except httpx.TimeoutException as exc:
                return self._failure(
                    request, ReasonCode.TIMED_OUT, True, "timeout", f"no answer in time: {exc}"
                )
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
            if response.status_code != 429:
                return self._read(request, response)
            retry_after = retry_after_seconds(response.headers.get("retry-after"))
            if attempt == RATE_LIMIT_RETRIES:
                return self._error_line(request, response, retry_after=retry_after)
            stop.wait(min(retry_after if retry_after is not None else 2.0**attempt, MAX_RATE_LIMIT_WAIT))
        return None  # not reached: the last attempt always returns

    def _read(self, request: InferenceRequest, response: httpx.Response) -> ResultLine:
        try:
            return self._read_answer(request, response)
        except PARSE_ERRORS as exc:
            return unreadable_result(
                request.custom_id,
                f"an answer that could not be read ({type(exc).__name__}: {exc})",
                http_status=response.status_code,
                secrets=self.secrets,
            )

    def _read_answer(self, request: InferenceRequest, response: httpx.Response) -> ResultLine:
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

    def _error_line(
        self, request: InferenceRequest, response: httpx.Response, *, retry_after: float | None = None
    ) -> ResultLine:
        """An HTTP error, classified by its status; the server's own code and message are kept."""
        reason, transient = classify_http_status(response.status_code)
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
            retry_after=retry_after,
        )

    def _failure(
        self,
        request: InferenceRequest,
        reason: str,
        transient: bool,
        code: str,
        message: str,
        *,
        http_status: int | None = None,
        retry_after: float | None = None,
    ) -> ResultLine:
        return ResultLine(
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
