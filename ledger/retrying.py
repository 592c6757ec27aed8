"""Which failures are transient (SPEC §3 rule 8), and how long a server asks us to wait."""

import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime

# A unit the provider accepted, whose status or results it then refuses with a permanent error
# (a 4xx: not found, forbidden), is asked again for this long after the first refusal: the cause may
# be here (an API key or project changed) and the results, paid for, still there. Then its
# unanswered requests fail for good (`results_unavailable`), for an operator to retry.
PERMANENT_REFUSAL_PATIENCE = timedelta(hours=24)

# A Retry-After further ahead than this is treated as this: the work waits, it is not forgotten.
MAX_RETRY_AFTER = 24 * 3600.0


def is_transient_status(status: int) -> bool:
    """408, 429 and 5xx are worth retrying; any other 4xx is permanent."""
    return status in (408, 429) or status >= 500


def retry_after_seconds(value: str | None, *, now: datetime | None = None) -> float | None:
    """`Retry-After` as seconds from now: delay-seconds or an HTTP date (RFC 9110 §10.2.3); None if unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def requested_wait(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """How long a server's answer asks us to wait, in seconds: `retry-after-ms` (OpenAI's, and the
    official SDK's first choice: finer than whole seconds), else `Retry-After`; None if neither is
    readable."""
    try:
        milliseconds = float(headers.get("retry-after-ms") or "")
    except ValueError:
        milliseconds = math.nan
    if math.isfinite(milliseconds):
        return min(max(milliseconds / 1000, 0.0), MAX_RETRY_AFTER)
    return retry_after_seconds(headers.get("retry-after"), now=now)
