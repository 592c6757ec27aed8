"""What the ledger keeps of a provider's answer to one request (SPEC rules 2 and 12).

Model output and everything else a provider returns is untrusted: a NUL or a lone surrogate no text
column can hold, a token count no integer column can hold, 20 MB of text, usage nested a thousand
deep, a number where a text should be. Each part a collection reads (a `ResultLine`, or an anomaly
about the file) passes through `storable` once, before it is recorded: what cannot be kept becomes
that request's own failure, with a reason code, or an anomaly of its own, so the rest of its chunk
is recorded as usual. Whatever of the provider's words is kept is scrubbed of credentials here too.
"""

import dataclasses
import math
import reprlib
from dataclasses import dataclass, field

import orjson
from django.conf import settings

from ..retrying import MAX_RETRY_AFTER
from ..states import ReasonCode
from .scrubbing import REDACTED, fit_to_keep, fits_text, scrub_credentials, secrets_pattern


@dataclass(frozen=True, slots=True)
class ResultLine:
    """One result as a provider's adapter reads it, matched to a request by `custom_id` only. A
    failure carries the ledger's `reason` (a `ReasonCode` value) and whether it is `transient`,
    decided by the adapter; the provider's own `error_code` and `error_message` are kept to be shown."""

    custom_id: str
    succeeded: bool
    content: str = ""
    usage: dict = field(default_factory=dict)
    input_tokens: int = 0
    output_tokens: int = 0
    apportioned: bool = False  # tokens are this request's share of a unit-wide total
    http_status: int | None = None
    error_code: str = ""
    error_message: str = ""
    reason: str = ""
    transient: bool = False
    retry_after: float | None = None
    # The provider says the model stopped at its output-token limit: the draft is cut off.
    truncated: bool = False


# A version's token columns are PositiveIntegerFields.
MOST_TOKENS = 2**31 - 1
# A request's custom_id column; a longer one was never ours.
CUSTOM_ID_LIMIT = 64
# Characters kept of a provider's error code, of its message, and of a value shown in an anomaly.
CODE_LIMIT = 100
MESSAGE_LIMIT = 1000
SHOWN_LIMIT = 500
# Bytes of a draft's usage kept (a usage is a few hundred).
USAGE_LIMIT = 8192
REASON_CODES = frozenset(ReasonCode.values)
# A value of an unexpected type, shown in a few words (nested and huge values included).
_shown = reprlib.Repr(maxlevel=3, maxstring=60, maxother=60)


def shown(value: object) -> str:
    """A value of an unexpected type in a few words."""
    try:
        return _shown.repr(value)
    except (ValueError, RecursionError):  # an integer of more digits than Python will print
        return f"a {type(value).__name__} too large to show"


def storable(part, *, secrets: tuple[str, ...] = ()) -> tuple:
    """`part` (a `ResultLine`, or an anomaly dict) as the ledger can keep it, with an anomaly about
    it after it when something of it could not be kept: (part,) or (part, anomaly). A line already
    fit to keep is returned as it is (the usual case, checked cheaply). `secrets`: the configured
    keys and tokens, read once for the collection (`configured_secrets`)."""
    if isinstance(part, dict):
        return (keepable_json(part, secrets=secrets),)
    custom_id = part.custom_id
    if type(custom_id) is not str or len(custom_id) > CUSTOM_ID_LIMIT or not fits_text(custom_id):
        # Not one of ours, whatever it says: shown, never matched.
        return ({"kind": "unknown_custom_id", "custom_id": scrub(custom_id, secrets, SHOWN_LIMIT)},)
    if part.succeeded:
        return storable_draft(part, secrets)
    return (storable_failure(part, secrets),)


def storable_draft(line: ResultLine, secrets: tuple[str, ...]) -> tuple:
    content = line.content
    if type(content) is not str:
        return (
            failed(
                line, ReasonCode.UNREADABLE_RESULT, f"The answer is not text but {type(content).__name__}"
            ),
        )
    most = settings.BATCHDESK_MAX_ANSWER_BYTES
    if len(content) > most:
        return (too_large(line, f"{len(content):,} characters", most),)
    if "\x00" in content:
        return (
            failed(line, ReasonCode.GARBLED_ANSWER, "The answer holds a NUL character: no text can keep it"),
        )
    if not content.isascii():
        try:
            size = len(content.encode())
        except UnicodeEncodeError as exc:
            return (
                failed(
                    line,
                    ReasonCode.GARBLED_ANSWER,
                    f"The answer holds a broken character (a lone surrogate) at character {exc.start}: "
                    "no text can keep it",
                ),
            )
        if size > most:
            return (too_large(line, f"{size:,} bytes", most),)
    changes = {}
    usage_problem = usage_problems(line)
    if usage_problem:
        changes = {"usage": {}, "input_tokens": 0, "output_tokens": 0}
    if secrets and any(secret in content for secret in secrets):
        # A draft is kept whole, except for our own keys.
        changes["content"] = secrets_pattern(secrets).sub(REDACTED, content)
    if not changes:
        return (line,)
    kept = dataclasses.replace(line, **changes)
    if not usage_problem:
        return (kept,)
    return (kept, {"kind": "implausible_usage", "custom_id": line.custom_id, "problem": usage_problem})


def usage_problems(line: ResultLine) -> str:
    """Why a draft's usage and token counts cannot be kept as the provider wrote them ("" if they
    can): a count beyond what its column holds, or a usage that is not a small JSON object a JSON
    column can hold."""
    for name in ("input_tokens", "output_tokens"):
        count = getattr(line, name)
        if type(count) is not int or not 0 <= count <= MOST_TOKENS:
            return f"{name} {keepable(count, 40)} is not a token count"
    usage = line.usage
    if type(usage) is not dict:
        return f"the usage is {type(usage).__name__}, not an object"
    try:
        # orjson refuses what no provider's usage holds: a lone surrogate, an integer beyond 64
        # bits, nesting beyond 254 levels.
        text = orjson.dumps(usage)
    except TypeError as exc:
        return f"the usage cannot be kept: {keepable(str(exc), 200)}"
    if len(text) > USAGE_LIMIT:
        return f"the usage is {len(text):,} bytes"
    if b"\\u0000" in text:
        return "the usage holds a NUL"
    return ""


def storable_failure(line: ResultLine, secrets: tuple[str, ...]) -> ResultLine:
    """A failed line's words scrubbed, cut short and fit to keep; its reason a known code."""
    code = scrub(line.error_code, secrets, CODE_LIMIT)
    message = scrub(line.error_message, secrets, MESSAGE_LIMIT)
    reason = line.reason if line.reason in REASON_CODES else ReasonCode.MODEL_FAILED
    transient = line.transient is True
    retry_after = line.retry_after
    if retry_after is not None:
        try:
            retry_after = min(max(float(retry_after), 0.0), MAX_RETRY_AFTER)
        except (TypeError, ValueError, OverflowError):
            retry_after = None
        if retry_after is not None and math.isnan(retry_after):
            retry_after = None
    if (code, message, reason, transient, retry_after) == (
        line.error_code,
        line.error_message,
        line.reason,
        line.transient,
        line.retry_after,
    ):
        return line
    return dataclasses.replace(
        line,
        error_code=code,
        error_message=message,
        reason=reason,
        transient=transient,
        retry_after=retry_after,
    )


def too_large(line: ResultLine, size: str, most: int) -> ResultLine:
    return failed(
        line,
        ReasonCode.ANSWER_TOO_LARGE,
        f"The answer is {size}; at most {most:,} bytes are kept (BATCHDESK_MAX_ANSWER_BYTES)",
    )


def failed(line: ResultLine, reason: str, message: str) -> ResultLine:
    """A draft that arrived (and may have been paid for) but cannot be kept: a permanent failure of
    its request alone, never sent again by itself (rule 8)."""
    return ResultLine(
        custom_id=line.custom_id,
        succeeded=False,
        http_status=line.http_status,
        error_code=str(reason),
        error_message=message,
        reason=reason,
    )


def scrub(value: object, secrets: tuple[str, ...], limit: int) -> str:
    """A provider's words scrubbed, then cut to `limit` characters: scrubbed before they are cut, when
    half a key would no longer be found, but not all of a huge text."""
    text = value if type(value) is str else shown(value)
    return fit_to_keep(scrub_credentials(text[: limit + SHOWN_LIMIT], secrets)[:limit])


def keepable(value: object, limit: int) -> str:
    """`value` as text a column can hold, at most `limit` characters: a value of another type
    shown in a few words, a NUL or a lone surrogate replaced by U+FFFD."""
    text = value if type(value) is str else shown(value)
    return fit_to_keep(text[:limit])


def keepable_json(value: object, *, secrets: tuple[str, ...] = (), depth: int = 0) -> object:
    """An anomaly's value as a JSON column can hold it: texts scrubbed, cut short and fit to keep,
    numbers beyond 64 bits as text, nesting beyond a few levels shown in a few words."""
    if type(value) is str:
        return scrub(value, secrets, SHOWN_LIMIT) if value else value
    if value is None or type(value) in (bool, float) and math.isfinite(value):
        return value
    if type(value) is int:
        return value if abs(value) < 2**63 else str(value)
    if depth < 4 and type(value) is dict:
        return {
            scrub(key, secrets, SHOWN_LIMIT): keepable_json(inner, secrets=secrets, depth=depth + 1)
            for key, inner in list(value.items())[:50]
        }
    if depth < 4 and type(value) in (list, tuple):
        return [keepable_json(inner, secrets=secrets, depth=depth + 1) for inner in value[:50]]
    return keepable(shown(value), SHOWN_LIMIT)
