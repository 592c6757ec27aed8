"""Anthropic Message Batches over httpx (reference/providers.md §2).

A batch carries its requests inline and no metadata of ours, so a batch whose create answer was
lost can only be looked for in the listing: batches created around the time it was sent with
the same number of requests are candidates, owned or ruled out by the custom_ids of their
results (SPEC rule 13). With an output schema the model is made to call one tool, `output`,
whose input is the draft: its JSON is the content the ledger validates.
"""

import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import httpx

from ..drafts.schema_dialects import Dialect, sent_schema
from ..drafts.scrubbing import scrub_credentials
from ..states import ReasonCode
from . import base
from .http import HttpBatchProvider, configured_key, provider_client, read_jsonl_result, unreadable_result

API_VERSION = "2023-06-01"
DEFAULT_PORTS = {"http": 80, "https": 443}
BATCHES = "/v1/messages/batches"
OUTPUT_TOOL = "output"
# A tool's input_schema takes any JSON Schema and nothing decodes under it strictly: the model
# reads the whole schema, length rules and all (rule 17).
SCHEMA_DIALECT = Dialect.AS_IS
LISTING_PAGE = 1000  # the most the listing gives in one page
# A candidate may have been created a little before our clock said we sent it (clocks differ),
# and well after (queues, retries inside the create call).
CLOCK_SKEW = timedelta(seconds=60)
CREATE_WINDOW = timedelta(minutes=15)
# The results of requests that never ran, by type: (what the ledger keeps, reason, transient). A
# `canceled` one comes only from our own cancel (a cancelled job, a duplicate unit): sending it again
# by itself would undo that decision, so it waits for a person, as OpenAI's `batch_cancelled`.
NEVER_RAN = {
    "expired": ("The batch reached its 24 hours before this request ran.", ReasonCode.BATCH_EXPIRED, True),
    "canceled": ("The batch was canceled before this request ran.", ReasonCode.MODEL_FAILED, False),
}

# The error type inside an `errored` result, in the ledger's words: (reason, transient, HTTP
# status the same error has as an answer to a call). Unknown types are permanent model failures.
ERROR_TYPES = {
    "invalid_request_error": (ReasonCode.REQUEST_INVALID, False, 400),
    "authentication_error": (ReasonCode.REQUEST_INVALID, False, 401),
    "billing_error": (ReasonCode.REQUEST_INVALID, False, 402),
    "permission_error": (ReasonCode.REQUEST_INVALID, False, 403),
    "not_found_error": (ReasonCode.REQUEST_INVALID, False, 404),
    "request_too_large": (ReasonCode.REQUEST_INVALID, False, 413),
    "rate_limit_error": (ReasonCode.RATE_LIMITED, True, 429),
    "api_error": (ReasonCode.MODEL_SERVER_ERROR, True, 500),
    "timeout_error": (ReasonCode.TIMED_OUT, True, 504),
    "overloaded_error": (ReasonCode.MODEL_SERVER_ERROR, True, 529),
}


def batch_request(request: base.InferenceRequest) -> dict:
    """One entry of a batch's `requests`: our custom_id and Messages API parameters."""
    params = {
        "model": request.model,
        "max_tokens": request.max_output_tokens,
        "system": request.system_message,
        "messages": [{"role": "user", "content": request.user_message}],
    }
    if request.output_schema:
        # Forcing the one tool is how Anthropic returns JSON that matches a schema.
        params["tools"] = [
            {
                "name": OUTPUT_TOOL,
                "description": "Record the answer, in the shape the schema gives.",
                "input_schema": sent_schema(request.output_schema, SCHEMA_DIALECT).schema,
            }
        ]
        params["tool_choice"] = {"type": "tool", "name": OUTPUT_TOOL}
    return {"custom_id": request.custom_id, "params": params}


def message_content(message: dict) -> str | None:
    """The draft in a message: the input of the `output` tool as JSON when the model called it,
    else its text blocks joined; None when the message has no content list at all."""
    blocks = message.get("content")
    if not isinstance(blocks, list):
        return None
    blocks = [block for block in blocks if isinstance(block, dict)]
    for block in blocks:
        if block.get("type") == "tool_use" and block.get("name") == OUTPUT_TOOL:
            return json.dumps(block.get("input"), ensure_ascii=False)
    return "".join(str(block.get("text") or "") for block in blocks if block.get("type") == "text")


def parse_result_line(
    line_number: int, text: str, *, secrets: Iterable[str] = ()
) -> base.ResultLine | base.UnreadableLine:
    """One line of a results file. What is kept of a failure (its error, or the text of an
    unreadable line) is scrubbed of credentials; a draft is the model's text and kept whole."""
    return read_jsonl_result(line_number, text, _parse_line, secrets=secrets)


def _parse_line(line_number: int, line: dict, *, secrets: Iterable[str]) -> base.ResultLine:
    custom_id = line["custom_id"]
    result = line.get("result") if isinstance(line.get("result"), dict) else {}
    kind = result.get("type")
    if kind == "succeeded":
        message = result.get("message") if isinstance(result.get("message"), dict) else {}
        content = message_content(message)
        if content is None:
            # Paid for but unusable: a permanent failure of that request, never an automatic re-send.
            return unreadable_result(
                custom_id, f"line {line_number}: a succeeded result without message.content"
            )
        usage = message.get("usage") if isinstance(message.get("usage"), dict) else {}
        counted = {
            "usage": usage,
            "input_tokens": base.token_count(usage.get("input_tokens")),
            "output_tokens": base.token_count(usage.get("output_tokens")),
            "http_status": 200,
        }
        # How the model stopped (reference/providers.md §8.2): `refusal` declined to answer, whatever
        # text came before it; `max_tokens` cut the draft off.
        stop_reason = message.get("stop_reason")
        if stop_reason == "refusal":
            return base.refused_by_model(custom_id, said="refusal", words=content, secrets=secrets, **counted)
        return base.ResultLine(
            custom_id=custom_id,
            succeeded=True,
            content=content,
            truncated=stop_reason == "max_tokens",
            **counted,
        )
    if kind == "errored":
        envelope = result.get("error") if isinstance(result.get("error"), dict) else {}
        # `{"type": "error", "error": {"type": ..., "message": ...}, "request_id": ...}`
        inner = envelope.get("error") if isinstance(envelope.get("error"), dict) else envelope
        code = str(inner.get("type") or "error")
        reason, transient, status = ERROR_TYPES.get(code, (ReasonCode.MODEL_FAILED, False, None))
        return base.ResultLine(
            custom_id=custom_id,
            succeeded=False,
            http_status=status,
            error_code=code,
            error_message=scrub_credentials(str(inner.get("message") or ""), secrets),
            reason=reason,
            transient=transient,
        )
    if isinstance(kind, str) and kind in NEVER_RAN:
        message, reason, transient = NEVER_RAN[kind]
        return base.ResultLine(
            custom_id=custom_id,
            succeeded=False,
            error_code=kind,
            error_message=message,
            reason=reason,
            transient=transient,
        )
    # A result type nobody promised: we cannot tell whether it was paid for, so no re-send.
    return base.ResultLine(
        custom_id=custom_id,
        succeeded=False,
        error_code="unreadable_result",
        error_message=f"line {line_number}: unknown result type {str(kind)[:50]!r}",
        reason=ReasonCode.UNREADABLE_RESULT,
    )


class RefusedAddress(base.ProviderError):
    """An address the adapter will not call: asking again gives the same answer."""

    @property
    def transient(self) -> bool:
        return False


def origin(url: httpx.URL) -> tuple[str, str, int | None]:
    """Scheme, host and port (the scheme's default when none is written) of an absolute URL."""
    return url.scheme, url.host.lower(), url.port or DEFAULT_PORTS.get(url.scheme)


def request_total(batch: dict) -> int:
    counts = batch.get("request_counts")
    if not isinstance(counts, dict):
        return 0
    return sum(base.token_count(value) for value in counts.values() if isinstance(value, int | float))


class AnthropicBatchProvider(HttpBatchProvider):
    name = "anthropic"
    schema_dialect = SCHEMA_DIALECT
    capabilities = base.Capabilities(
        finding=base.Finding.BY_LISTING,  # a batch carries no metadata of ours
        can_cancel=True,
        max_requests=100_000,
        max_bytes=256 * 1024 * 1024,
        delivery=base.Delivery.FILE,
        # Results are available for 29 days after the batch's creation (§8.3); no file to delete.
        results_kept=base.ResultsKept(timedelta(days=29), base.CountedFrom.CREATION),
    )

    def __init__(self, *, client: httpx.Client, results_hosts: Iterable[str] = ()):
        super().__init__(client=client)
        # Besides the API's own address, where a batch's results_url may lead (a gateway in front
        # of the downloads): `host` (the scheme's default port) or `host:port`.
        self.results_hosts = frozenset(host.strip().lower() for host in results_hosts if host.strip())

    @classmethod
    def from_settings(cls, config: dict) -> "AnthropicBatchProvider":
        # Without a key Anthropic answers 401, shown as such.
        headers = {"x-api-key": configured_key(config), "anthropic-version": API_VERSION}
        client = provider_client(config, headers=headers)
        return cls(client=client, results_hosts=config.get("results_hosts", ()))

    def request_bytes(self, request: base.InferenceRequest) -> int:
        # Its JSON inside the `requests` array, and the comma after it.
        return len(json.dumps(batch_request(request), ensure_ascii=False).encode("utf-8")) + 1

    def submit(self, *, requests: list[base.InferenceRequest], intent_key: str, metadata: dict) -> str:
        # Anthropic keeps no metadata on a batch: the intent key stays with us (find_units).
        body = {"requests": [batch_request(request) for request in requests]}
        response = self._call("POST", BATCHES, json=body, answer_may_be_lost=True)
        batch_id = self._json(response, answer_may_be_lost=True).get("id")
        if not isinstance(batch_id, str) or not batch_id:
            # Created or not, we cannot tell which batch: reconcile as if the answer were lost.
            raise base.AnswerLost(f"POST {BATCHES} answered without a batch id", secrets=self.secrets)
        return batch_id

    def find_units(self, *, intent_key: str, sent_at: datetime, request_count: int) -> list[str]:
        """Candidates: batches created from `sent_at` (less clock skew) to 15 minutes after,
        with `request_count` requests, oldest first. Only their results can tell which is ours."""
        sent_at = sent_at if sent_at.tzinfo else sent_at.replace(tzinfo=UTC)
        earliest, latest = sent_at - CLOCK_SKEW, sent_at + CREATE_WINDOW
        found = []
        after_id = None
        while True:
            params = {"limit": LISTING_PAGE, **({"after_id": after_id} if after_id else {})}
            page = self._json(self._call("GET", BATCHES, params=params))
            data = page.get("data") if isinstance(page.get("data"), list) else []
            batches = [batch for batch in data if isinstance(batch, dict)]
            for batch in batches:
                created = base.parse_time(batch.get("created_at"))
                if created is not None and earliest <= created <= latest and isinstance(batch.get("id"), str):
                    if request_total(batch) == request_count:
                        found.append(batch["id"])
            # Newest first: once a page reaches before the window, the rest is older still.
            oldest = base.parse_time(batches[-1].get("created_at")) if batches else None
            if not page.get("has_more") or not batches or (oldest is not None and oldest < earliest):
                return list(reversed(found))
            after_id = page.get("last_id") or batches[-1].get("id")
            if not isinstance(after_id, str) or not after_id:
                raise base.ProviderError(f"GET {BATCHES} says it has more but gives no id to go on from")

    def status(self, provider_ref: str) -> base.UnitStatus:
        batch = self._json(self._call("GET", f"{BATCHES}/{provider_ref}"))
        counts = batch.get("request_counts")
        word = batch.get("processing_status") if isinstance(batch.get("processing_status"), str) else ""
        problem = ""
        if batch.get("archived_at"):
            problem = f"results archived at {batch['archived_at']}: no longer available"
        return base.UnitStatus(
            provider_status=word,
            ended=word == "ended",
            # A batch Anthropic refuses is refused at create (400); once it exists it runs.
            refused=False,
            counts=base.UnitCounts(
                total=request_total(batch),
                succeeded=base.token_count(counts.get("succeeded")),
                failed=sum(base.token_count(counts.get(name)) for name in ("errored", "canceled", "expired")),
            )
            if isinstance(counts, dict)
            else None,
            problem=problem,
            ended_at=base.parse_time(batch.get("ended_at")),
        )

    def ended_results(self, provider_ref: str) -> base.Results:
        batch = self._json(self._call("GET", f"{BATCHES}/{provider_ref}"))
        # Read from the batch, never built: the address is Anthropic's to change (and absolute).
        results_url = batch.get("results_url")
        if not results_url or not isinstance(results_url, str):
            raise base.ProviderError(
                f"batch {provider_ref} has no results_url yet ({batch.get('processing_status')})"
            )
        self._check_same_origin(provider_ref, results_url)
        yield from self._stream_results(
            results_url,
            what=f"the results of {provider_ref}",
            parse=parse_result_line,
            headers={"accept": "application/binary"},
        )

    def _check_same_origin(self, provider_ref: str, results_url: str) -> None:
        """Our key goes with every call: a results_url elsewhere than the API (another scheme,
        host or port) is followed only to a host named in ANTHROPIC_RESULTS_HOSTS, with the API's
        scheme."""
        try:
            url = httpx.URL(results_url)
        except (httpx.InvalidURL, TypeError, ValueError) as exc:
            raise RefusedAddress(f"batch {provider_ref} has a results_url that is no URL: {exc}") from exc
        if url.is_relative_url:
            return  # under the client's base URL
        if origin(url) != origin(self.client.base_url) and not self._results_host(url):
            shown = f"{url.scheme}://{url.host}" + (f":{url.port}" if url.port else "")
            raise RefusedAddress(
                f"batch {provider_ref} has its results at {shown[:200]}, neither at the API's address "
                "nor on a host of ANTHROPIC_RESULTS_HOSTS: not followed (our key would go with it)"
            )

    def _results_host(self, url: httpx.URL) -> bool:
        scheme, host, port = origin(url)
        if scheme != self.client.base_url.scheme:
            return False  # never from https to http, where anyone on the way reads the key
        return f"{host}:{port}" in self.results_hosts or (
            host in self.results_hosts and port == DEFAULT_PORTS.get(scheme)
        )

    def cancel(self, provider_ref: str) -> str:
        response = self._call("POST", f"{BATCHES}/{provider_ref}/cancel")
        try:
            return str(response.json().get("processing_status", ""))
        except (ValueError, AttributeError):  # accepted, but the answer says nothing readable
            return ""
