"""Gemini API Batch Mode over httpx (reference/providers.md §4), with the REST shapes the official
`google-genai` SDK sends and reads (`google/genai/batches.py`):

- create `POST /models/{model}:batchGenerateContent` with
  `{"batch": {"displayName": <intent key>, "inputConfig": {"requests": {"requests": [
  {"request": GenerateContentRequest, "metadata": {"key": <custom_id>}}]}}}}`, answered with a
  long-running Operation named `batches/{id}` (our provider reference);
- `GET /batches/{id}`: the Operation, its `metadata` a GenerateContentBatch (`state`
  `BATCH_STATE_*`, `batchStats`, `displayName`); once ended `done: true` and the responses inline
  in `response.inlinedResponses.inlinedResponses` (the REST guide) or
  `metadata.output.inlinedResponses.inlinedResponses` (where the SDK reads them);
- `GET /batches?pageSize&pageToken` (`operations`, `nextPageToken`); `POST /batches/{id}:cancel`.

Responses are matched to requests by `metadata.key` only, never by position.
"""

import json
import os
import re
from collections.abc import Container, Iterable, Iterator
from datetime import datetime
from urllib.parse import quote

import httpx

from ..retrying import retry_after_seconds
from ..scrubbing import scrub_credentials
from ..states import ReasonCode
from .base import (
    AnswerLost,
    Capabilities,
    Delivery,
    Finding,
    InferenceRequest,
    ProviderError,
    ResultLine,
    UnitCounts,
    UnitStatus,
    UnreadableLine,
    classify_http_status,
    token_count,
)
from .http import PARSE_ERRORS, HttpBatchProvider, parse_failure

# REST says BATCH_STATE_*; the SDKs say JOB_STATE_*. Both are read by their suffix.
ENDED_STATES = {"SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED"}
# Batches that may end with no responses at all: the ledger reads why from `status`.
NO_RESULT_STATES = {"FAILED", "CANCELLED", "EXPIRED"}
# google.rpc.Code numbers, as a per-request `error.code` (a google.rpc.Status) carries them.
RPC_CODES = {
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}
# A per-request error in the ledger's words: (reason, transient). SPEC rule 8: what Google maps to
# 429, 5xx or a timeout retries by itself; what it maps to any other 4xx never does.
RPC_ERRORS = {
    "RESOURCE_EXHAUSTED": (ReasonCode.RATE_LIMITED, True),
    "UNAVAILABLE": (ReasonCode.MODEL_SERVER_ERROR, True),
    "INTERNAL": (ReasonCode.MODEL_SERVER_ERROR, True),
    "UNKNOWN": (ReasonCode.MODEL_SERVER_ERROR, True),
    "DATA_LOSS": (ReasonCode.MODEL_SERVER_ERROR, True),
    "DEADLINE_EXCEEDED": (ReasonCode.TIMED_OUT, True),
    "CANCELLED": (ReasonCode.MODEL_FAILED, False),
    "INVALID_ARGUMENT": (ReasonCode.REQUEST_INVALID, False),
    "FAILED_PRECONDITION": (ReasonCode.REQUEST_INVALID, False),
    "OUT_OF_RANGE": (ReasonCode.REQUEST_INVALID, False),
    "NOT_FOUND": (ReasonCode.REQUEST_INVALID, False),
    "ALREADY_EXISTS": (ReasonCode.REQUEST_INVALID, False),
    "ABORTED": (ReasonCode.REQUEST_INVALID, False),
    "PERMISSION_DENIED": (ReasonCode.REQUEST_INVALID, False),
    "UNAUTHENTICATED": (ReasonCode.REQUEST_INVALID, False),
    "UNIMPLEMENTED": (ReasonCode.REQUEST_INVALID, False),
}
# A candidate that ended for one of these has its text anyway (the ledger validates it).
TEXT_FINISHES = {"STOP", "MAX_TOKENS", "FINISH_REASON_UNSPECIFIED", ""}
COMPACT = (",", ":")
RETRY_DELAY = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")


def model_name(model: str) -> str:
    return model if model.startswith(("models/", "tunedModels/")) else f"models/{model}"


def inline_request(request: InferenceRequest) -> dict:
    """One entry of `inputConfig.requests.requests`. A JSON schema goes in `responseJsonSchema`
    (the SDK's `response_json_schema`: JSON Schema as is), not `responseSchema` (Google's
    OpenAPI subset, which would need translating)."""
    generation: dict = {"maxOutputTokens": request.max_output_tokens}
    if request.output_schema:
        generation["responseMimeType"] = "application/json"
        generation["responseJsonSchema"] = request.output_schema
    body: dict = {
        "contents": [{"role": "user", "parts": [{"text": request.user_message}]}],
        "generationConfig": generation,
    }
    if request.system_message:
        body["systemInstruction"] = {"parts": [{"text": request.system_message}]}
    return {"request": body, "metadata": {"key": request.custom_id}}


def state_word(operation: dict) -> str:
    metadata = operation.get("metadata")
    state = metadata.get("state") if isinstance(metadata, dict) else None
    return state if isinstance(state, str) else ""


def inlined_responses(operation: dict) -> list | None:
    """The inline responses of an ended batch: `response` (REST) or `metadata.output` (SDK)."""
    metadata = operation.get("metadata") if isinstance(operation.get("metadata"), dict) else {}
    for output in (operation.get("response"), metadata.get("output")):
        if isinstance(output, dict) and isinstance(output.get("inlinedResponses"), dict):
            found = output["inlinedResponses"].get("inlinedResponses")
            if isinstance(found, list):
                return found
    return None


def responses_file(operation: dict) -> str:
    metadata = operation.get("metadata") if isinstance(operation.get("metadata"), dict) else {}
    for output in (operation.get("response"), metadata.get("output")):
        if isinstance(output, dict) and isinstance(output.get("responsesFile"), str):
            return output["responsesFile"]
    return ""


def _int(value: object) -> int:
    """An int64 of proto JSON (a string), or a number; 0 when absent or unreadable."""
    return token_count(value)


def classify_error(error: dict) -> tuple[str, str, bool, int | None]:
    """(error_code, reason, transient, http_status) of a google.rpc.Status. Its `code` is a
    google.rpc.Code number; an HTTP status (≥ 100) or a `status` name are read as well."""
    code = error.get("code")
    name = error.get("status") if isinstance(error.get("status"), str) else ""
    http_status = code if isinstance(code, int) and code >= 100 else None
    if not name and isinstance(code, int) and code in RPC_CODES:
        name = RPC_CODES[code]
    if name.upper() in RPC_ERRORS:
        reason, transient = RPC_ERRORS[name.upper()]
        return name.upper(), reason, transient, http_status
    if http_status is not None:
        reason, transient = classify_http_status(http_status)
        return name or f"http_{http_status}", reason, transient, http_status
    return name or (f"code_{code}" if code is not None else "error"), ReasonCode.MODEL_FAILED, False, None


def parse_inlined(number: int, entry: object, *, secrets: Iterable[str] = ()) -> ResultLine | UnreadableLine:
    """One inlined response (`number` counts from 1). Without a string `metadata.key` it cannot be
    matched to a request: unreadable, never guessed from its position."""
    try:
        return _parse_inlined(number, entry, secrets=secrets)
    except PARSE_ERRORS as exc:
        metadata = entry.get("metadata") if isinstance(entry, dict) else None
        key = metadata.get("key") if isinstance(metadata, dict) else None
        return parse_failure(number, _shown(entry), key, exc, secrets=secrets)


def response_key(entry: object) -> str | None:
    """The custom_id an inlined response names in `metadata.key`, if it names one."""
    metadata = entry.get("metadata") if isinstance(entry, dict) else None
    key = metadata.get("key") if isinstance(metadata, dict) else None
    return key if isinstance(key, str) and key else None


def _shown(entry: object) -> str:
    try:
        return json.dumps(entry, ensure_ascii=False)
    except PARSE_ERRORS:
        return repr(entry)


def _parse_inlined(number: int, entry: object, *, secrets: Iterable[str]) -> ResultLine | UnreadableLine:
    def shown() -> str:
        return scrub_credentials(_shown(entry), secrets)[:500]

    if not isinstance(entry, dict):
        return UnreadableLine(number, shown(), "not an object")
    key = response_key(entry)
    if key is None:
        return UnreadableLine(number, shown(), "no metadata.key")
    error = entry.get("error")
    if isinstance(error, dict):
        code, reason, transient, http_status = classify_error(error)
        return ResultLine(
            custom_id=key,
            succeeded=False,
            http_status=http_status,
            error_code=code,
            error_message=scrub_credentials(str(error.get("message") or ""), secrets)[:2000],
            reason=reason,
            transient=transient,
        )
    response = entry.get("response")
    if not isinstance(response, dict):
        return UnreadableLine(number, shown(), "neither response nor error")
    usage = response.get("usageMetadata") if isinstance(response.get("usageMetadata"), dict) else {}
    tokens = {
        "input_tokens": _int(usage.get("promptTokenCount")),
        "output_tokens": _int(usage.get("candidatesTokenCount")),
    }
    candidates = response.get("candidates")
    candidate = (
        candidates[0]
        if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict)
        else None
    )
    if candidate is None:
        feedback = response.get("promptFeedback") if isinstance(response.get("promptFeedback"), dict) else {}
        blocked = feedback.get("blockReason")
        # Answered (and perhaps paid for) but with nothing to use: permanent, never re-sent by itself.
        return ResultLine(
            custom_id=key,
            succeeded=False,
            usage=usage,
            **tokens,
            error_code=str(blocked) if blocked else "unreadable_result",
            error_message=f"the prompt was blocked: {blocked}"
            if blocked
            else "a response without candidates",
            reason=ReasonCode.MODEL_FAILED if blocked else ReasonCode.UNREADABLE_RESULT,
        )
    content = candidate.get("content") if isinstance(candidate.get("content"), dict) else {}
    parts = content.get("parts") if isinstance(content.get("parts"), list) else []
    # Thought summaries are not the answer.
    text = "".join(
        part["text"]
        for part in parts
        if isinstance(part, dict) and isinstance(part.get("text"), str) and not part.get("thought")
    )
    finish = str(candidate.get("finishReason") or "")
    if not text and finish not in TEXT_FINISHES:
        return ResultLine(
            custom_id=key,
            succeeded=False,
            usage=usage,
            **tokens,
            error_code=finish,
            error_message=f"the candidate ended with {finish} and no text",
            reason=ReasonCode.MODEL_FAILED,
        )
    return ResultLine(custom_id=key, succeeded=True, content=text, usage=usage, **tokens)


class GeminiBatchProvider(HttpBatchProvider):
    name = "gemini"
    capabilities = Capabilities(
        finding=Finding.BY_KEY,  # the intent key is the batch's `displayName`, found by listing
        can_cancel=True,
        # The inline limit is 20 MB in, and every answer comes back inside one GET of the batch:
        # 5,000 requests keep that answer to a few MB at our output sizes (about 1-2 KB each).
        max_requests=5_000,
        # 20 MB for the whole create body, read as 20,000,000 bytes (the smaller reading); the
        # envelope (about 110 bytes with the intent key) fits in what is kept back.
        max_bytes=19_990_000,
        delivery=Delivery.INLINE,
        usage_per_request=True,
    )

    @classmethod
    def from_settings(cls, config: dict) -> "GeminiBatchProvider":
        # Without a key Google answers 403, shown as such.
        api_key = os.environ.get(config["api_key_env"]) or ""
        client = httpx.Client(
            base_url=config["base_url"],
            headers={"x-goog-api-key": api_key},
            timeout=httpx.Timeout(120.0, connect=10.0),
        )
        return cls(client=client)

    def request_bytes(self, request: InferenceRequest) -> int:
        # The entry and the comma after it, in the compact form `submit` sends.
        return (
            len(json.dumps(inline_request(request), ensure_ascii=False, separators=COMPACT).encode("utf-8"))
            + 1
        )

    @staticmethod
    def _retry_after(response: httpx.Response) -> float | None:
        """`Retry-After`, else the `retryDelay` ("37s") of a google.rpc.RetryInfo detail."""
        seconds = retry_after_seconds(response.headers.get("retry-after"))
        if seconds is not None:
            return seconds
        try:
            details = response.json()["error"]["details"]
        except (ValueError, KeyError, TypeError):
            return None
        for detail in details if isinstance(details, list) else []:
            delay = detail.get("retryDelay") if isinstance(detail, dict) else None
            match = RETRY_DELAY.match(delay) if isinstance(delay, str) else None
            if match:
                return retry_after_seconds(match.group(1))
        return None

    def submit(self, *, requests: list[InferenceRequest], intent_key: str, metadata: dict) -> str:
        """Gemini batches carry no metadata but their display name: the intent key goes there,
        and `metadata` is not sent."""
        models = {model_name(request.model) for request in requests}
        if len(models) != 1:
            raise ProviderError(f"one model per Gemini batch, got {sorted(models)}", status=400)
        body = {
            "batch": {
                "displayName": intent_key,
                "inputConfig": {"requests": {"requests": [inline_request(r) for r in requests]}},
            }
        }
        path = f"/{quote(models.pop(), safe='/')}:batchGenerateContent"
        # Serialised as `request_bytes` counts it, so the 20 MB limit is checked on what is sent.
        payload = json.dumps(body, ensure_ascii=False, separators=COMPACT).encode("utf-8")
        headers = {"content-type": "application/json; charset=utf-8"}
        operation = self._json(
            self._call("POST", path, content=payload, headers=headers, answer_may_be_lost=True),
            answer_may_be_lost=True,
        )
        name = operation.get("name")
        if not isinstance(name, str) or not name.startswith("batches/"):
            # Created, but we cannot tell which batch it is: reconcile as if the answer were lost.
            raise AnswerLost(f"POST {path} answered without a batch name", secrets=self.secrets)
        return name

    def find_units(
        self, *, intent_key: str, sent_at: datetime | None = None, request_count: int = 0
    ) -> list[str]:
        found = []
        token = None
        while True:
            params = {"pageSize": 100, **({"pageToken": token} if token else {})}
            page = self._json(self._call("GET", "/batches", params=params))
            operations = page.get("operations") if isinstance(page.get("operations"), list) else []
            for operation in operations:
                metadata = operation.get("metadata") if isinstance(operation, dict) else None
                name = operation.get("name") if isinstance(operation, dict) else None
                if isinstance(metadata, dict) and metadata.get("displayName") == intent_key and name:
                    found.append((str(metadata.get("createTime") or ""), str(name)))
            token = page.get("nextPageToken")
            if not token or not isinstance(token, str) or not operations:
                # The listing's order is not promised: oldest first by creation time (RFC 3339
                # in UTC sorts as text).
                return [name for _, name in sorted(found)]

    def status(self, provider_ref: str) -> UnitStatus:
        operation = self._json(self._call("GET", f"/{provider_ref}"))
        word = state_word(operation)
        suffix = word.rsplit("_STATE_", 1)[-1]
        ended = suffix in ENDED_STATES or operation.get("done") is True
        has_results = inlined_responses(operation) is not None or bool(responses_file(operation))
        metadata = operation.get("metadata") if isinstance(operation.get("metadata"), dict) else {}
        stats = metadata.get("batchStats")
        error = operation.get("error") if isinstance(operation.get("error"), dict) else {}
        problem = str(error.get("message") or "")
        if suffix == "EXPIRED" and not problem:
            problem = "the batch expired before it finished (48 hours): no results"
        return UnitStatus(
            provider_status=word or ("done" if ended else "unknown"),
            ended=ended,
            refused=suffix == "FAILED" and not has_results,
            counts=UnitCounts(
                total=_int(stats.get("requestCount")),
                succeeded=_int(stats.get("successfulRequestCount")),
                failed=_int(stats.get("failedRequestCount")),
            )
            if isinstance(stats, dict)
            else None,
            problem=scrub_credentials(problem, self.secrets)[:2000],
            # An expired batch has no results at all; its requests are retried (transient).
            unanswered_reason=ReasonCode.BATCH_EXPIRED if suffix == "EXPIRED" else "",
        )

    def results(
        self,
        provider_ref: str,
        *,
        skip: Container[str] = (),
        requests: Iterable[InferenceRequest] = (),
    ) -> Iterator[ResultLine | UnreadableLine]:
        operation = self._json(self._call("GET", f"/{provider_ref}"))
        entries = inlined_responses(operation)
        suffix = state_word(operation).rsplit("_STATE_", 1)[-1]
        if not entries and suffix not in NO_RESULT_STATES:
            # Finished (or said to be) with no answer at all: the ledger would record every
            # request missing and send again work that succeeded. Not yet readable: ask again.
            file_name = responses_file(operation)
            raise ProviderError(
                f"batch {provider_ref} ({state_word(operation) or 'no state'}) has its results in a "
                f"file, which BatchDesk never asks for: {file_name[:200]}"
                if file_name
                else f"batch {provider_ref} ({state_word(operation) or 'no state'}) gave no responses",
                secrets=self.secrets,
            )
        if entries and not any(map(response_key, entries)):
            # Users report the service answering inline requests without their metadata. Every
            # answer is then anonymous: matching by position would be a guess (responses are
            # reported out of order too), and recording the requests as missing would send again,
            # and pay again for, work that was done. The unit waits, saying why, for an operator.
            raise ProviderError(
                f"batch {provider_ref} answered {len(entries)} responses, none naming its request "
                "(no metadata.key): they are never matched by position, and their requests are not "
                "sent again (they ran, and were paid for). Nothing is recorded until the answers "
                "name their requests, or an operator cancels the job.",
                secrets=self.secrets,
            )
        for number, entry in enumerate(entries or [], start=1):
            yield parse_inlined(number, entry, secrets=self.secrets)

    def cancel(self, provider_ref: str) -> str:
        try:
            self._call("POST", f"/{provider_ref}:cancel")
        except ProviderError as exc:
            # Already ended (Google: FAILED_PRECONDITION): nothing left to stop; say how it ended.
            if exc.status != 400 or "FAILED_PRECONDITION" not in str(exc):
                raise
        # The cancel answers `{}`; the batch says what it is now.
        try:
            return self.status(provider_ref).provider_status
        except ProviderError:
            return ""
