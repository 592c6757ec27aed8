"""Every knob an emulator takes (its fault and behaviour settings), and the one parser that checks
them: the emulator's constructor, `configure(...)`, `POST /_emulator/config` and the flags of
`run_emulator` all set knobs through `parse`. `FaultKnobs` are what every protocol shares; each
protocol's own knobs subclass it here, so one module lists them all.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from ledger.notices.signed_webhooks import signer


class KnobError(ValueError):
    """A knob was given a value it cannot take; answered 400 in the protocol's envelope."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


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


# How a model answers a property it need not write (`textgen`): it writes each one; it answers null
# wherever the schema it was sent takes null (as a model in OpenAI's strict mode answers an optional
# property it has nothing for); or it leaves out each property that schema does not require.
OPTIONAL_ANSWERS = ("written", "null", "left_out")


def optional_answers(name: str, value: Any) -> str:
    if value not in OPTIONAL_ANSWERS:
        raise KnobError(name, f"{name} must be one of {', '.join(OPTIONAL_ANSWERS)}")
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
    # How every answer treats a property it need not write (`OPTIONAL_ANSWERS`).
    optional_properties: str = knob("written", optional_answers)
    # Batch webhooks (reference/providers.md §8.4), for the protocols whose provider sends them
    # (OpenAI, Gemini): when a unit ends, its event is posted to `webhook_url`, signed as Standard
    # Webhooks do with `webhook_secret`, `webhook_deliveries` times with the same webhook-id (at
    # least once, as the providers promise; 2 exercises a receiver's deduplication).
    webhook_url: str | None = knob(None, hook_url)
    webhook_secret: str | None = knob(None, hook_secret)
    webhook_deliveries: int = knob(1, positive_count)


def matches(prefix: str | None, method: str, path: str) -> bool:
    """Whether a call falls under a knob's path prefix ("/v1/batches" or "POST /v1/batches")."""
    if prefix is None:
        return True
    wanted_method, _, wanted_path = prefix.rpartition(" ")
    return wanted_method in ("", method) and path.startswith(wanted_path)


def parse(knobs_class: type[FaultKnobs], given: dict[str, Any]) -> dict[str, Any]:
    """`given` checked against `knobs_class`: each value as its knob's check returns it. Raises
    `KnobError` naming the first unknown knob, or the knob whose value is refused."""
    names = [knob.name for knob in fields(knobs_class)]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise KnobError(unknown[0], f"Unknown knob(s) {', '.join(unknown)}; known: {', '.join(names)}.")
    checks = {knob.name: knob.metadata["check"] for knob in fields(knobs_class)}
    return {name: checks[name](name, value) for name, value in given.items()}


def knob_names(knobs_class: type[FaultKnobs]) -> str:
    return ", ".join(knob.name for knob in fields(knobs_class))


# --- each protocol's own knobs ----------------------------------------------------------------


@dataclass
class OpenAIKnobs(FaultKnobs):
    # Refuse a strict json_schema outside OpenAI's subset, as the real API does (providers.md §8.1).
    strict_schemas: bool = knob(True, flag)


@dataclass
class AnthropicKnobs(FaultKnobs):
    cancel_ms: float = knob(50, duration)  # how long `canceling` lasts before the batch ends


@dataclass
class CloudflareKnobs(FaultKnobs):
    queued_ms: float = knob(100, duration)  # how long a unit waits in the queue before it runs


@dataclass
class GeminiKnobs(FaultKnobs):
    # Every response comes without its request's key (inline: no `metadata`; file: no `key`).
    keyless_responses: bool = knob(False, flag)


def optional_text(name: str, value: Any) -> str | None:
    if value is not None and not (isinstance(value, str) and value.strip()):
        raise KnobError(name, f"{name} must be a non-empty text or null")
    return value


# How a 429 of the rate limit says when to come back: not at all, `Retry-After` in whole seconds
# (rounded up), `retry-after-ms`, `Retry-After` as an HTTP date (whole seconds, rounded up),
# `llm_provider-retry-after` in whole seconds (a LiteLLM proxy passing on its provider's), or
# OpenAI's `x-ratelimit-reset-requests` as a duration ("1.5s", "1m0s", "250ms").
WINDOW_HINTS = (
    "none",
    "retry-after",
    "retry-after-ms",
    "http-date",
    "llm_provider-retry-after",
    "x-ratelimit-reset-requests",
)


def window_length(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise KnobError(name, f"{name} must be a number of milliseconds above 0")
    return value


def window_hint(name: str, value: Any) -> str:
    if value not in WINDOW_HINTS:
        raise KnobError(name, f"{name} must be one of {', '.join(WINDOW_HINTS)}")
    return value


def request_ids(name: str, value: Any) -> list[str]:
    if not (isinstance(value, list | tuple) and all(isinstance(v, str) and v for v in value)):
        raise KnobError(name, f"{name} must be a list of request ids (custom_ids)")
    return list(value)


@dataclass
class CompatibleKnobs(FaultKnobs):
    no_choices: int = knob(0, count)  # this many answers are JSON without `choices`
    # Like `vllm serve --api-key KEY`: every API call needs `Authorization: Bearer KEY`. None: no
    # key at all, as most self-hosted servers run.
    api_key: str | None = knob(None, optional_text)
    # A rate limit like a proxy's requests per minute: at most this many completion calls in any
    # `window_ms` (0: no limit); one more is answered 429 before any work.
    requests_per_window: int = knob(0, count)
    window_ms: float = knob(60_000, window_length)
    window_hint: str = knob("retry-after", window_hint)
    # Every API call is answered `every_request_refused_status` with these words, before any work
    # (None: off), as a LiteLLM proxy without a database answers a key it cannot check: 400
    # "No connected db.", whatever the request.
    every_request_refused: str | None = knob(None, optional_text)
    every_request_refused_status: int = knob(400, refusal_status)
    # The completion calls of these custom_ids are answered 400 as vLLM answers a prompt longer
    # than the model's context: a refusal of that request alone, in words of its own.
    too_long_requests: list[str] = knob([], request_ids)
