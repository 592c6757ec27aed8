"""Which failures are transient (SPEC §3 rule 8), and how long a server asks us to wait: one reader
of every header a provider, a self-hosted server or a gateway in front of one says it with."""

import math
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

# A unit the provider accepted, whose status or results it then refuses with a permanent error
# (a 4xx: not found, forbidden), is asked again for this long after the first refusal: the cause may
# be here (an API key or project changed) and the results, paid for, still there. Then its
# unanswered requests fail for good (`results_unavailable`), for an operator to retry.
PERMANENT_REFUSAL_PATIENCE = timedelta(hours=24)

# A wait further ahead than this is treated as this: the work waits, it is not forgotten (and a
# server asking for a year, by mistake or in malice, does not park it for a year).
MAX_RETRY_AFTER = 24 * 3600.0

# LiteLLM's proxy passes on the headers of the provider behind it with this prefix
# (`llm_provider-retry-after: 60`): the same words, said by the server behind the gateway.
PASSED_ON = "llm_provider-"

# A plain non-negative number: no sign, exponent, `inf`, `nan` or `1_000`, which float() would take.
_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")
# A duration as OpenAI writes `x-ratelimit-reset-*` (Go's: "1s", "6m0s", "20ms", "1h2m3.5s") and
# Google's `retryDelay` ("37s").
_DURATION = re.compile(r"(?:(?:\d+(?:\.\d*)?|\.\d+)(?:h|ms|m|s|us|µs|ns))+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|ns)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def is_transient_status(status: int) -> bool:
    """408, 429 and 5xx are worth retrying; any other 4xx is permanent."""
    return status in (408, 429) or status >= 500


def _bounded(seconds: float) -> float | None:
    """A wait of `seconds`, capped at MAX_RETRY_AFTER (a number too large for a float included);
    None when it is not a number of at least 0 (a negative wait is not a wait: garbage, ignored)."""
    if math.isnan(seconds) or seconds < 0:
        return None
    return min(seconds, MAX_RETRY_AFTER)


def _until(when: datetime, now: datetime | None) -> float | None:
    """Seconds from now until `when`: 0 once it has passed (come back now), capped like any wait."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return _bounded(max((when - (now or datetime.now(UTC))).total_seconds(), 0.0))


def number_seconds(value: str | None, *, scale: float = 1.0) -> float | None:
    """A plain number of seconds (or of `scale` seconds: 0.001 for milliseconds), bounded."""
    text = (value or "").strip()
    if not _NUMBER.fullmatch(text):
        return None
    return _bounded(float(text) * scale)


def retry_after_seconds(value: str | None, *, now: datetime | None = None) -> float | None:
    """`Retry-After` as seconds from now: delay-seconds or an HTTP date (RFC 9110 §10.2.3); None if unreadable."""
    text = (value or "").strip()
    if _NUMBER.fullmatch(text):
        return number_seconds(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return _until(when, now)


def duration_seconds(value: str | None, *, now: datetime | None = None) -> float | None:
    """A duration written with units ("1s", "6m0s", "20ms", "1h2m3.5s"), as seconds; None if unreadable."""
    text = (value or "").strip()
    if not _DURATION.fullmatch(text):
        return None
    return _bounded(sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _DURATION_PART.findall(text)))


def time_seconds(value: str | None, *, now: datetime | None = None) -> float | None:
    """An RFC 3339 time (Anthropic's `anthropic-ratelimit-*-reset`) as seconds from now; None if unreadable."""
    text = (value or "").strip()
    if not 10 < len(text) < 64:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return _until(when, now)


def _has_room(remaining: str | None) -> bool:
    """Whether a limit's `…-remaining` header says it has room left (a count above 0)."""
    text = (remaining or "").strip()
    return bool(_NUMBER.fullmatch(text)) and float(text) > 0


def _milliseconds(value: str | None, *, now: datetime | None = None) -> float | None:
    return number_seconds(value, scale=0.001)


# What a server asks for outright, each party's finest first: `retry-after-ms` (OpenAI's, and the
# official SDK's first choice: finer than whole seconds), else `Retry-After`.
ASKED = (("retry-after-ms", _milliseconds), ("retry-after", retry_after_seconds))
# When a limit is full again, with the header that says whether it is spent: OpenAI's durations,
# Anthropic's times.
RESETS: tuple[tuple[str, str, Callable[..., float | None]], ...] = (
    ("x-ratelimit-reset-requests", "x-ratelimit-remaining-requests", duration_seconds),
    ("x-ratelimit-reset-tokens", "x-ratelimit-remaining-tokens", duration_seconds),
    ("anthropic-ratelimit-requests-reset", "anthropic-ratelimit-requests-remaining", time_seconds),
    ("anthropic-ratelimit-tokens-reset", "anthropic-ratelimit-tokens-remaining", time_seconds),
    ("anthropic-ratelimit-input-tokens-reset", "anthropic-ratelimit-input-tokens-remaining", time_seconds),
    ("anthropic-ratelimit-output-tokens-reset", "anthropic-ratelimit-output-tokens-remaining", time_seconds),
)


def requested_wait(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """How long a server's answer (a 429, a 503) asks us to wait before the next try, in seconds, at
    most MAX_RETRY_AFTER; None if it does not say in any way read here.

    What it asks outright comes first: `retry-after-ms`, else `Retry-After` (seconds or an HTTP
    date), from the server and from the provider behind a LiteLLM gateway (`llm_provider-…`); when
    both say, the longer, since both must be satisfied. Failing that, when its spent limits are full
    again: `x-ratelimit-reset-requests` / `-tokens` (OpenAI: "1s", "6m0s", "20ms") and
    `anthropic-ratelimit-*-reset` (an RFC 3339 time), the latest of the limits not said to have room
    left (`…-remaining` above 0): a limit with room is not what refused us. A value that cannot be
    read, or is negative, is ignored; one further ahead than MAX_RETRY_AFTER is capped."""
    asked = []
    for prefix in ("", PASSED_ON):
        for name, read in ASKED:
            seconds = read(headers.get(prefix + name), now=now)
            if seconds is not None:
                asked.append(seconds)
                break
    if asked:
        return max(asked)
    resets = []
    for prefix in ("", PASSED_ON):
        for name, remaining, read in RESETS:
            seconds = read(headers.get(prefix + name), now=now)
            if seconds is not None and not _has_room(headers.get(prefix + remaining)):
                resets.append(seconds)
    return max(resets, default=None)
