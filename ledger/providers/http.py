"""What every adapter that speaks HTTP shares: one httpx client (`provider_client`), its credentials
kept out of every message it stores, and one call that tells a request that never left this machine from one whose
answer was lost on the way back (SPEC rule 3)."""

import json
import math
import os
from collections.abc import Container, Iterable, Iterator

import httpx
import jiter

from ..drafts.scrubbing import header_credentials, scrub_credentials
from ..retrying import requested_wait
from ..states import ReasonCode
from .base import (
    AnswerLost,
    BatchProvider,
    InferenceRequest,
    NotSent,
    ProviderError,
    ResultLine,
    Results,
    UnreadableLine,
    is_billing_refusal,
    tls_context,
)

# How long a call may take to connect; how long it may wait for an answer is the adapter's.
CONNECT_TIMEOUT = 10.0
# Failures that prove the request never left this machine.
NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)
# What reading a result of an unexpected shape can raise: caught around every parser, so a result
# nobody promised becomes a line, never an exception that ends the collection.
PARSE_ERRORS = (AttributeError, TypeError, ValueError, OverflowError, KeyError, IndexError, RecursionError)


def _finite(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


# One decoder for every line (`json.loads` with arguments builds a new one at each call).
_DECODER = json.JSONDecoder(parse_constant=lambda name: None, parse_float=_finite)


def loads(text: str) -> object:
    """JSON as a provider wrote it, with NaN, Infinity and numbers too large for a float read as
    null: none of them is JSON, and a JSON column would refuse to store them. Read by jiter (several
    times faster than the json module) where it reads alike; by the json module, with its own
    words for a refusal, where it does not (NaN, a lone surrogate, anything refused, and a number
    too large for a float, which jiter reads as infinity)."""
    if text.startswith("\ufeff"):
        return json.loads(text)  # refused, with the json module's own words for it
    try:
        value = jiter.from_json(text.encode(), allow_inf_nan=False, cache_mode="keys")
    except (UnicodeEncodeError, ValueError):
        return _decode(text)
    return value if _all_finite(value) else _decode(text)


def _decode(text: str) -> object:
    try:
        return _DECODER.decode(text)
    except RecursionError:
        # Nested deeper than Python reads: refused like any other text that is not JSON, so one
        # such line is unreadable alone instead of ending the whole collection.
        raise ValueError("nested too deeply to read") from None


def _all_finite(value) -> bool:
    """No float in `value` (read from JSON: dicts, lists and scalars) is infinite."""
    if type(value) is float:
        return math.isfinite(value)
    waiting = [value] if type(value) in (dict, list) else []
    while waiting:
        container = waiting.pop()
        for inner in container.values() if type(container) is dict else container:
            kind = type(inner)
            if kind is dict or kind is list:
                waiting.append(inner)
            elif kind is float and not math.isfinite(inner):
                return False
    return True


def jsonl_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """The lines of a JSONL stream arriving in chunks: each ends at a newline (a carriage return
    before it is dropped) and is read as UTF-8, a byte that is not UTF-8 as U+FFFD (as httpx reads
    text). Unlike httpx's `iter_lines` (str.splitlines), a U+2028 or a form feed inside a JSON
    string does not end its line, and a line is split with one `bytes.split` a chunk, not decoded
    and searched character by character."""
    pending: list[bytes] = []  # the start of a line that has not ended in the chunks so far
    for chunk in chunks:
        *ended, rest = chunk.split(b"\n")
        for piece in ended:
            if pending:
                pending.append(piece)
                piece = b"".join(pending)
                pending.clear()
            yield piece.removesuffix(b"\r").decode("utf-8", "replace")
        if rest:
            pending.append(rest)
    if pending:
        yield b"".join(pending).removesuffix(b"\r").decode("utf-8", "replace")


def unreadable_result(
    custom_id: str, message: str, *, http_status: int | None = None, secrets=()
) -> ResultLine:
    """A result that arrived for `custom_id` (and may have been paid for) but cannot be used: a
    permanent failure of that request, never sent again by itself."""
    return ResultLine(
        custom_id=custom_id,
        succeeded=False,
        http_status=http_status,
        error_code="unreadable_result",
        error_message=scrub_credentials(message, secrets)[:1000],
        reason=ReasonCode.UNREADABLE_RESULT,
    )


def parse_failure(
    line_number: int, shown: str, custom_id: object, exc: Exception, *, secrets=()
) -> ResultLine | UnreadableLine:
    """What a parser that raised `exc` on a result yields instead: a failed `unreadable_result`
    for its request when its custom_id could be read (a line without a result would be
    `missing_result`, re-sent: it may have succeeded), else an `UnreadableLine`."""
    problem = f"unreadable: {type(exc).__name__}: {scrub_credentials(str(exc), secrets)[:200]}"
    if isinstance(custom_id, str) and custom_id:
        return unreadable_result(custom_id, f"line {line_number}: {problem}", secrets=secrets)
    return UnreadableLine(line_number, scrub_credentials(shown, secrets)[:500], problem)


def read_jsonl_result(line_number: int, text: str, parse, *, secrets=()) -> ResultLine | UnreadableLine:
    """One line of a JSONL results file that names its request by `custom_id`: parsed by
    `parse(line_number, line, secrets=...)`, or unreadable. What is kept of an unreadable line is
    scrubbed of credentials."""
    try:
        line = loads(text)
    except ValueError as exc:
        return UnreadableLine(line_number, scrub_credentials(text, secrets)[:500], f"not JSON: {exc}")
    if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str):
        return UnreadableLine(line_number, scrub_credentials(text, secrets)[:500], "no custom_id")
    try:
        return parse(line_number, line, secrets=secrets)
    except PARSE_ERRORS as exc:
        return parse_failure(line_number, text, line["custom_id"], exc, secrets=secrets)


def configured_key(config: dict) -> str:
    """The key held by the environment variable `settings.PROVIDERS[name]` names ("" when unset):
    read when the client is built, never stored in the settings."""
    return os.environ.get(config["api_key_env"]) or ""


def provider_client(
    config: dict, *, headers: dict[str, str], read_timeout: float = 60.0, limits: httpx.Limits | None = None
) -> httpx.Client:
    """The one way an adapter's HTTP client is set up: the configured base URL, the provider's
    credential headers, certificates checked with the shared TLS context, CONNECT_TIMEOUT to
    connect and `read_timeout` for the rest, and httpx's connection limits unless `limits`."""
    return httpx.Client(
        base_url=config["base_url"],
        verify=tls_context(),
        headers=headers,
        timeout=httpx.Timeout(read_timeout, connect=CONNECT_TIMEOUT),
        **({"limits": limits} if limits is not None else {}),
    )


class HttpBatchProvider(BatchProvider):
    def __init__(self, *, client: httpx.Client):
        self.client = client
        # What a provider echoes of these in an error is never kept.
        self.secrets = header_credentials(client.headers)

    def results(
        self, provider_ref: str, *, skip: Container[str] = (), requests: Iterable[InferenceRequest] = ()
    ) -> Results:
        """A batch provider's results are what it wrote when the unit ended (`ended_results`):
        `skip` and `requests` concern only a synchronous server, which asks per request."""
        return self.ended_results(provider_ref)

    def ended_results(self, provider_ref: str) -> Results:
        """Every result of an ended unit, streamed, in the provider's order."""
        raise NotImplementedError

    def _call(self, method: str, path: str, *, answer_may_be_lost: bool = False, **kwargs) -> httpx.Response:
        """One call. With `answer_may_be_lost`, a failure after the request may have reached the
        provider is AnswerLost (the caller must reconcile), not an ordinary, retryable error."""
        try:
            response = self.client.request(method, path, **kwargs)
        except (*NEVER_SENT, httpx.InvalidURL) as exc:
            raise NotSent(f"{method} {path} could not be sent: {exc}", secrets=self.secrets) from exc
        except httpx.TransportError as exc:
            if answer_may_be_lost:
                raise AnswerLost(
                    f"{method} {path} was sent but no answer arrived: {exc}", secrets=self.secrets
                ) from exc
            raise ProviderError(f"{method} {path} failed: {exc}", secrets=self.secrets) from exc
        except httpx.HTTPError as exc:
            # The provider answered (a body that cannot be decoded, redirects without end): on a
            # create, it may have made the unit, so the caller reconciles.
            if answer_may_be_lost:
                raise AnswerLost(
                    f"{method} {path} was answered but the answer could not be read: {exc}",
                    secrets=self.secrets,
                ) from exc
            raise ProviderError(f"{method} {path} failed: {exc}", secrets=self.secrets) from exc
        if response.status_code >= 400:
            raise self._refusal(method, path, response)
        return response

    def _json(self, response: httpx.Response, *, answer_may_be_lost: bool = False) -> dict:
        """The JSON object a call answered. Anything else is a ProviderError; on a call whose
        answer may be lost (a create), AnswerLost: the provider answered, so the unit may exist."""
        try:
            body = loads(response.text)
        except ValueError:
            body = None
        if isinstance(body, dict):
            return body
        request = response.request
        said = scrub_credentials(response.text, self.secrets)[:300]
        problem = f"{request.method} {request.url.path} answered what is not a JSON object: {said}"
        raise (AnswerLost if answer_may_be_lost else ProviderError)(problem, secrets=self.secrets)

    def _stream_results(self, url: str, *, what: str, parse, headers: dict | None = None) -> Results:
        """A JSONL results download, parsed line by line as it streams in. A download cut short
        (or unreadable) is a ProviderError after the lines already read: they are recorded, the
        rest comes with the next try."""
        try:
            with self.client.stream("GET", url, headers=headers) as response:
                if response.status_code >= 400:
                    response.read()
                    raise self._refusal("GET", what, response)
                for number, text in enumerate(jsonl_lines(response.iter_bytes()), start=1):
                    if text.strip():
                        yield parse(number, text, secrets=self.secrets)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise ProviderError(f"download of {what} was interrupted: {exc}", secrets=self.secrets) from exc

    def _refusal(self, method: str, path: str, response: httpx.Response) -> ProviderError:
        """A 4xx/5xx answer as a ProviderError, transient or not by its status."""
        # Scrubbed before it is cut short: half a key would no longer look like one.
        said = scrub_credentials(response.text, self.secrets)[:300]
        return ProviderError(
            f"{method} {path} answered {response.status_code}: {said}",
            status=response.status_code,
            retry_after=self._retry_after(response),
            billing=is_billing_refusal(response.status_code, response.text),
        )

    @staticmethod
    def _retry_after(response: httpx.Response) -> float | None:
        return requested_wait(response.headers)
