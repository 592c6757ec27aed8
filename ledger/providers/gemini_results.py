"""Gemini's answers in the ledger's words (reference/providers.md §4, §8.2): where an ended
batch's Operation keeps its responses (inline or in a responses file), and each response, or its
google.rpc.Status error, as a result line matched to its request by key only."""

import json
from collections.abc import Iterable

from ..drafts.scrubbing import scrub_credentials, stored_text
from ..states import ReasonCode
from .base import (
    ResultLine,
    UnreadableLine,
    classify_http_status,
    refused_by_model,
    token_count,
)
from .http import PARSE_ERRORS, loads, parse_failure

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
# A candidate that ended for one of these was withheld by the model or Google's filters
# (reference/providers.md §8.2): refused, whatever text came before it.
REFUSING_FINISHES = {"SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII"}


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


def proto_int(value: object) -> int:
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


def file_key(line: object) -> str | None:
    """The custom_id a line of a responses file names in `key` (or, should Google write it the
    inline way, `metadata.key`), if it names one."""
    key = line.get("key") if isinstance(line, dict) else None
    if key is None:
        return response_key(line)
    return key if isinstance(key, str) and key else None


def parse_file_line(number: int, text: str, *, secrets: Iterable[str] = ()) -> ResultLine | UnreadableLine:
    """One line of a responses file (`number` counts from 1): `{"key", "response" | "error"}`.
    Without a string key it cannot be matched to a request: unreadable, never guessed from its
    position."""
    try:
        line = loads(text)
    except ValueError as exc:
        return UnreadableLine(number, scrub_credentials(text, secrets)[:500], f"not JSON: {exc}")
    try:
        return _parse_file_line(number, line, secrets=secrets)
    except PARSE_ERRORS as exc:
        return parse_failure(number, text, file_key(line), exc, secrets=secrets)


def _parse_file_line(number: int, line: object, *, secrets: Iterable[str]) -> ResultLine | UnreadableLine:
    if (
        isinstance(line, dict)
        and not isinstance(line.get("error"), dict)
        and isinstance(line.get("status"), dict)
    ):
        # A "status object" (the guide's words for a failed line) under `status`: read as `error`.
        line = {**line, "error": line["status"]}
    return _parse_answer(number, line, file_key(line), "no key", secrets=secrets)


def _parse_inlined(number: int, entry: object, *, secrets: Iterable[str]) -> ResultLine | UnreadableLine:
    return _parse_answer(number, entry, response_key(entry), "no metadata.key", secrets=secrets)


def _parse_answer(
    number: int, entry: object, key: str | None, keyless: str, *, secrets: Iterable[str]
) -> ResultLine | UnreadableLine:
    """One answer, inline or from a file, already known to name `key` (None: it names none, and
    is unreadable with the problem `keyless`)."""

    def shown() -> str:
        return scrub_credentials(_shown(entry), secrets)[:500]

    if not isinstance(entry, dict):
        return UnreadableLine(number, shown(), "not an object")
    if key is None:
        return UnreadableLine(number, shown(), keyless)
    error = entry.get("error")
    if isinstance(error, dict):
        code, reason, transient, http_status = classify_error(error)
        return ResultLine(
            custom_id=key,
            succeeded=False,
            http_status=http_status,
            error_code=code,
            error_message=stored_text(scrub_credentials(str(error.get("message") or ""), secrets)),
            reason=reason,
            transient=transient,
        )
    response = entry.get("response")
    if not isinstance(response, dict):
        return UnreadableLine(number, shown(), "neither response nor error")
    usage = response.get("usageMetadata") if isinstance(response.get("usageMetadata"), dict) else {}
    tokens = {
        "input_tokens": proto_int(usage.get("promptTokenCount")),
        "output_tokens": proto_int(usage.get("candidatesTokenCount")),
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
        if blocked:
            # A blocked prompt gets no candidates at all: refused, as the same prompt would be again.
            words = feedback.get("blockReasonMessage")
            return refused_by_model(
                key,
                said=f"blockReason {blocked}",
                words=str(words) if words else "the provider blocked the prompt",
                secrets=secrets,
                usage=usage,
                **tokens,
            )
        # Answered (and perhaps paid for) but with nothing to use: permanent, never re-sent by itself.
        return ResultLine(
            custom_id=key,
            succeeded=False,
            usage=usage,
            **tokens,
            error_code="unreadable_result",
            error_message="a response without candidates",
            reason=ReasonCode.UNREADABLE_RESULT,
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
    if finish in REFUSING_FINISHES:
        words = text or f"the candidate ended with {finish}"
        return refused_by_model(key, said=finish, words=words, secrets=secrets, usage=usage, **tokens)
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
    return ResultLine(
        custom_id=key, succeeded=True, content=text, usage=usage, truncated=finish == "MAX_TOKENS", **tokens
    )
