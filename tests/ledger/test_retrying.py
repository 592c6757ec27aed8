"""How long a server asks us to wait (`ledger.retrying.requested_wait`, issue 28 point 7): every
header a provider, a self-hosted server or a gateway says it with, read by one parser, bounded, and
with what cannot be read (or is negative) ignored."""

from datetime import UTC, datetime

import httpx
import pytest

from ledger.retrying import MAX_RETRY_AFTER, duration_seconds, requested_wait, retry_after_seconds

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
DAY = 24 * 3600.0


def wait(headers: dict[str, str]) -> float | None:
    """What an answer with these headers, at NOW, asks (headers read as httpx reads them)."""
    return requested_wait(httpx.Headers(headers), now=NOW)


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        # Retry-After: delay-seconds, or an HTTP date (RFC 9110 §10.2.3); a date gone by is "now".
        ({"retry-after": "1"}, 1.0),
        ({"retry-after": " 2.5 "}, 2.5),
        ({"Retry-After": "120"}, 120.0),
        ({"retry-after": "Sun, 01 Mar 2026 12:02:00 GMT"}, 120.0),
        ({"retry-after": "Sun, 01 Mar 2026 11:00:00 GMT"}, 0.0),
        # retry-after-ms (OpenAI's, finer): before Retry-After from the same server.
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "1500", "retry-after": "1"}, 1.5),
        ({"retry-after-ms": "soon", "retry-after": "3"}, 3.0),
        # A LiteLLM gateway passing on its provider's words.
        ({"llm_provider-retry-after": "60"}, 60.0),
        ({"llm_provider-retry-after-ms": "2500"}, 2.5),
        ({"llm_provider-retry-after": "Sun, 01 Mar 2026 12:00:30 GMT"}, 30.0),
        # The gateway and the provider behind it both ask: both must be satisfied.
        ({"retry-after": "5", "llm_provider-retry-after": "60"}, 60.0),
        ({"retry-after": "60", "llm_provider-retry-after": "5"}, 60.0),
        # OpenAI's limits: when the spent one is full again, as a duration.
        ({"x-ratelimit-reset-requests": "1s"}, 1.0),
        ({"x-ratelimit-reset-requests": "6m0s"}, 360.0),
        ({"x-ratelimit-reset-tokens": "20ms"}, 0.02),
        ({"x-ratelimit-reset-requests": "1h2m3.5s"}, 3723.5),
        ({"x-ratelimit-reset-tokens": "0.5s"}, 0.5),
        # Both limits: the latest of those not said to have room; one with room did not refuse us.
        ({"x-ratelimit-reset-requests": "2s", "x-ratelimit-reset-tokens": "30s"}, 30.0),
        (
            {
                "x-ratelimit-reset-requests": "2s",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-tokens": "30s",
                "x-ratelimit-remaining-tokens": "149000",
            },
            2.0,
        ),
        ({"llm_provider-x-ratelimit-reset-requests": "7s"}, 7.0),
        # Anthropic's: an RFC 3339 time.
        ({"anthropic-ratelimit-requests-reset": "2026-03-01T12:00:45Z"}, 45.0),
        ({"anthropic-ratelimit-tokens-reset": "2026-03-01T12:01:00+00:00"}, 60.0),
        ({"anthropic-ratelimit-input-tokens-reset": "2026-03-01T11:59:00Z"}, 0.0),
        (
            {
                "anthropic-ratelimit-requests-reset": "2026-03-01T12:00:05Z",
                "anthropic-ratelimit-requests-remaining": "0",
                "anthropic-ratelimit-output-tokens-reset": "2026-03-01T12:00:50Z",
                "anthropic-ratelimit-output-tokens-remaining": "7000",
            },
            5.0,
        ),
        # What it asks outright comes before when a limit resets.
        ({"retry-after": "3", "x-ratelimit-reset-requests": "6m0s"}, 3.0),
        # Nothing said.
        ({}, None),
    ],
)
def test_each_way_a_server_says_how_long_to_wait_is_read(headers, seconds):
    assert wait(headers) == (None if seconds is None else pytest.approx(seconds))


@pytest.mark.parametrize(
    "headers",
    [
        # Garbage, negative and not-a-number values are ignored, as if nothing were said.
        {"retry-after": "-5"},
        {"retry-after": "soon"},
        {"retry-after": "nan"},
        {"retry-after": "inf"},
        {"retry-after": "1e3"},
        {"retry-after": "1_000"},
        {"retry-after": ""},
        {"retry-after": "Sun, 99 Foo 2026 12:00:00 GMT"},
        {"retry-after-ms": "-250"},
        {"retry-after-ms": "NaN"},
        {"llm_provider-retry-after": "a minute"},
        {"x-ratelimit-reset-requests": "-1s"},
        {"x-ratelimit-reset-requests": "1"},  # no unit: a count, an epoch? not a duration
        {"x-ratelimit-reset-requests": "1d"},
        {"x-ratelimit-reset-requests": "s"},
        {"x-ratelimit-reset-tokens": "1s2"},
        {"anthropic-ratelimit-requests-reset": "tomorrow"},
        {"anthropic-ratelimit-requests-reset": "2026-13-01T00:00:00Z"},
        {"anthropic-ratelimit-requests-reset": "9" * 5000},
    ],
)
def test_what_cannot_be_read_or_is_negative_is_ignored(headers):
    assert wait(headers) is None


@pytest.mark.parametrize(
    "headers",
    [
        # A hostile or absurd ask is capped: the work waits a day at most, it is not parked for ever.
        {"retry-after": "99999999999"},
        {"retry-after": "9" * 400},  # a float of infinity, once read
        {"retry-after": "Fri, 31 Dec 9999 23:59:59 GMT"},
        {"retry-after-ms": "1" + "0" * 30},
        {"llm_provider-retry-after": "31536000"},
        {"x-ratelimit-reset-requests": "99999999h"},
        {"anthropic-ratelimit-tokens-reset": "9999-12-31T23:59:59Z"},
    ],
)
def test_an_absurd_wait_is_capped_at_a_day(headers):
    assert MAX_RETRY_AFTER == DAY
    assert wait(headers) == DAY


def test_an_ignored_header_leaves_the_next_one_to_say():
    assert wait({"retry-after-ms": "-1", "retry-after": "4"}) == 4.0
    assert wait({"retry-after": "garbage", "x-ratelimit-reset-requests": "2s"}) == 2.0


def test_the_parts_each_read_one_format():
    assert retry_after_seconds("7") == 7.0 and retry_after_seconds(None) is None
    # Google's retryDelay is a duration too.
    assert duration_seconds("37s") == 37.0 and duration_seconds("1.5s") == 1.5
    assert duration_seconds("37") is None
