"""The openai_compatible adapter against its emulator (a self-hosted server), over real HTTP."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import jsonschema
import pytest

from ledger.emulators.openai_compatible import CompatibleServerEmulator
from ledger.providers import get_provider
from ledger.providers import openai_compatible as module
from ledger.providers.base import Delivery, Finding, InferenceRequest, ProviderError, ResultLine
from ledger.providers.openai_compatible import CompatibleServerProvider, SlowDown
from ledger.states import ReasonCode

SCHEMA = {
    "type": "object",
    "properties": {"headline": {"type": "string"}, "description": {"type": "string"}},
    "required": ["headline", "description"],
    "additionalProperties": False,
}
KEY_ENV = "OPENAI_COMPATIBLE_API_KEY"
ROOT = Path(__file__).resolve().parents[2]


def requests(n: int, prefix: str = "bd", model: str = "llama-3.1-8b") -> list[InferenceRequest]:
    return [
        InferenceRequest(
            custom_id=f"{prefix}-{i}-1",
            model=model,
            system_message="You write product descriptions.",
            user_message=f"Write a description.\nTitle: Beech spoon {i}\nFacts:\n- material: beech\n- length: {20 + i} cm",
            output_schema=SCHEMA,
            max_output_tokens=300,
        )
        for i in range(n)
    ]


@pytest.fixture
def emulator():
    with CompatibleServerEmulator(per_request_ms=20, seed=5) as running:
        yield running


@pytest.fixture
def build(settings, monkeypatch, emulator):
    """The adapter as the ledger builds it, from settings, pointed at the emulator."""
    monkeypatch.delenv(KEY_ENV, raising=False)

    def build(*, concurrency: int = 4, key: str | None = None, base_url: str | None = None):
        if key is not None:
            monkeypatch.setenv(KEY_ENV, key)
        settings.PROVIDERS = {
            **settings.PROVIDERS,
            "openai_compatible": {
                **settings.PROVIDERS["openai_compatible"],
                "base_url": base_url or emulator.base_url,
                "concurrency": concurrency,
            },
        }
        return get_provider("openai_compatible")

    return build


def collect(provider, sent, **kwargs) -> dict[str, ResultLine]:
    ref = provider.submit(requests=sent, intent_key="bd_intent_1", metadata={})
    lines = list(provider.results(ref, requests=sent, **kwargs))
    assert all(isinstance(line, ResultLine) for line in lines)
    by_id = {line.custom_id: line for line in lines}
    assert len(by_id) == len(lines), "a custom_id answered twice"
    return by_id


def dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_capabilities_say_per_request_and_nothing_to_find_or_cancel():
    capabilities = CompatibleServerProvider.capabilities
    assert capabilities.delivery == Delivery.PER_REQUEST
    assert capabilities.finding == Finding.NOT_AT_ALL
    assert capabilities.can_cancel is False
    assert 0 < capabilities.max_requests <= 500


def test_submit_and_status_make_no_call_and_cannot_lose_an_answer(build, emulator):
    provider = build(base_url=dead_url())  # nothing listens there: any call would fail

    ref = provider.submit(requests=requests(3), intent_key="bd_abc", metadata={"job": "j"})
    status = provider.status(ref)

    assert ref == "local-bd_abc"
    assert status.ended and not status.refused and status.provider_status == "ready"
    assert provider.find_units(intent_key="bd_abc", sent_at=None, request_count=3) == [ref]
    assert emulator.stats()["creates"] == 0


def test_results_ask_each_request_once_and_answer_schema_valid_json(build, emulator):
    sent = requests(9)

    lines = collect(build(), sent)

    assert set(lines) == {r.custom_id for r in sent}
    for line in lines.values():
        assert line.succeeded and line.http_status == 200
        jsonschema.validate(json.loads(line.content), SCHEMA)
        assert line.input_tokens > 0 and line.output_tokens > 0
        assert line.usage["total_tokens"] == line.input_tokens + line.output_tokens
    assert emulator.stats()["inferences"] == {r.custom_id: 1 for r in sent}


def test_requests_already_recorded_are_never_sent_again(build, emulator):
    sent = requests(6)
    recorded = {sent[0].custom_id, sent[3].custom_id}

    lines = collect(build(), sent, skip=recorded)

    assert set(lines) == {r.custom_id for r in sent} - recorded
    calls = emulator.stats()["calls_by_custom_id"]
    assert set(calls) == {r.custom_id for r in sent} - recorded


def test_skip_is_read_just_before_each_request_is_sent(build, emulator):
    sent = requests(6)
    recorded: set[str] = set()  # what the ledger holds; another worker records bd-5-1 meanwhile
    provider = build(concurrency=1)

    stream = provider.results("local-k", skip=recorded, requests=sent)
    first = next(stream)
    recorded.add("bd-5-1")
    rest = list(stream)

    assert first.custom_id == "bd-0-1"
    assert [line.custom_id for line in rest] == ["bd-1-1", "bd-2-1", "bd-3-1", "bd-4-1"]
    assert "bd-5-1" not in emulator.stats()["calls_by_custom_id"]


def test_never_more_in_flight_than_the_concurrency(build, emulator):
    emulator.configure(per_request_ms=80)
    sent = requests(10)

    started = time.monotonic()
    lines = collect(build(concurrency=2), sent)
    elapsed = time.monotonic() - started

    assert len(lines) == 10
    assert emulator.stats()["max_in_flight"] == 2  # two at a time, never three
    assert elapsed >= 5 * 0.08  # ten answers two at a time: at least five rounds


def test_each_answer_is_yielded_the_moment_it_arrives(build, emulator):
    emulator.configure(per_request_ms=100)
    sent = requests(8)
    provider = build(concurrency=2)

    stream = provider.results(provider.submit(requests=sent, intent_key="k", metadata={}), requests=sent)
    first = next(stream)
    answered_by_then = sum(emulator.stats()["inferences"].values())
    rest = list(stream)

    assert first.succeeded
    assert answered_by_then <= 3  # not the whole unit: the ledger records answers as they come
    assert len(rest) == 7


def test_closing_early_stops_sending_and_leaves_no_thread_behind(build, emulator):
    emulator.configure(per_request_ms=100)
    sent = requests(20)
    provider = build(concurrency=2)

    stream = provider.results(provider.submit(requests=sent, intent_key="k", metadata={}), requests=sent)
    next(stream)
    stream.close()  # the ledger stopped reading (its worker is being stopped)
    deadline = time.monotonic() + 5
    while [t for t in threading.enumerate() if t.name.startswith("compatible-server")]:
        assert time.monotonic() < deadline, "the adapter's threads outlived what they had in flight"
        time.sleep(0.02)

    calls = sum(emulator.stats()["calls_by_custom_id"].values())
    assert calls <= 4  # the first answers and those in flight; never the other sixteen
    time.sleep(0.3)
    assert sum(emulator.stats()["calls_by_custom_id"].values()) == calls


def test_a_429_is_waited_out_honouring_retry_after(build, emulator, monkeypatch):
    monkeypatch.setattr(module, "FIRST_PAUSE", 0.05)  # the backoff a 429 is never paused less than
    emulator.configure(rate_limit_calls=3, retry_after=0.2)
    sent = requests(2)

    started = time.monotonic()
    lines = collect(build(concurrency=1), sent)

    assert set(lines) == {r.custom_id for r in sent}
    assert all(line.succeeded for line in lines.values())
    assert emulator.stats()["rejected_calls"] == 3
    assert time.monotonic() - started >= 3 * 0.2


def test_a_429_asking_for_longer_than_a_worker_waits_ends_the_round_without_failing_the_request(
    build, emulator
):
    emulator.configure(rate_limit_calls=100, retry_after=1000)

    with pytest.raises(SlowDown) as raised:
        list(build().results("local-k", requests=requests(3)))

    # One call (a round begins with one in flight), no line: the request did not fail.
    assert emulator.stats()["rejected_calls"] == 1
    assert raised.value.transient and raised.value.status == 429
    assert 999 < raised.value.retry_after <= 1000  # the unit waits for what the server asked


def refused_calls_keep_to_what_the_server_asked(calls: list[dict], *, in_flight: int) -> None:
    """After each 429, fewer than `in_flight` calls reach the server before the instant its
    answer named (those already on their way); with one in flight, none at all."""
    for n, refused in enumerate(calls):
        if refused["rate_limited"]:
            early = [call for call in calls[n + 1 :] if call["at"] < refused["retry_at"]]
            assert len(early) < in_flight, (refused, early)


# retry-after-ms asks for more than a second: longer than a client that reads only Retry-After
# would guess; so do a LiteLLM gateway's `llm_provider-retry-after` and OpenAI's reset duration.
@pytest.mark.parametrize(
    ("hint", "window_ms"),
    [
        ("retry-after-ms", 2500),
        ("retry-after", 1000),
        ("http-date", 1000),
        ("llm_provider-retry-after", 2500),
        ("x-ratelimit-reset-requests", 2500),
    ],
)
def test_a_429_is_waited_out_as_long_as_the_server_asks_and_no_request_fails(
    build, emulator, hint, window_ms
):
    emulator.configure(requests_per_window=2, window_ms=window_ms, window_hint=hint)
    sent = requests(3)

    lines = collect(build(concurrency=1), sent)

    assert set(lines) == {r.custom_id for r in sent}
    assert all(line.succeeded for line in lines.values())
    stats = emulator.stats()
    assert stats["rate_limited_calls"] >= 1  # the limit was met
    assert stats["inferences"] == {r.custom_id: 1 for r in sent}
    refused_calls_keep_to_what_the_server_asked(stats["completion_calls"], in_flight=1)
    # Each 429 was followed by the call the server allowed, not by a second refusal.
    refusals = [call["rate_limited"] for call in stats["completion_calls"]]
    assert (True, True) not in zip(refusals, refusals[1:], strict=False)


def test_a_429_pauses_every_call_of_the_unit_and_fewer_go_at_once(build, emulator):
    emulator.configure(per_request_ms=30, requests_per_window=4, window_ms=400, window_hint="retry-after-ms")
    sent = requests(16)

    lines = collect(build(concurrency=4), sent)

    assert all(line.succeeded for line in lines.values()) and len(lines) == 16
    stats = emulator.stats()
    refused_calls_keep_to_what_the_server_asked(stats["completion_calls"], in_flight=4)
    # Four windows' worth of requests: about one refusal per window, not a storm.
    assert 1 <= stats["rate_limited_calls"] <= 8


@pytest.mark.parametrize("retry_after", [0, 0.001])
def test_a_429_asking_for_no_wait_is_still_backed_off_and_ends_the_round(
    build, emulator, monkeypatch, retry_after
):
    """Found by attacking issue 28: `Retry-After: 0` (or a date already past) took nothing from the
    round's patience, and the worker asked again at once, for ever."""
    monkeypatch.setattr(module, "FIRST_PAUSE", 0.05)
    monkeypatch.setattr(module, "LONGEST_PAUSE", 0.2)
    monkeypatch.setattr(module, "ROUND_PAUSE_BUDGET", 0.5)
    emulator.configure(rate_limit_calls=100_000, retry_after=retry_after)
    outcome = []

    def round_of_two():
        try:
            list(build(concurrency=1).results("local-k", requests=requests(2)))
        except SlowDown as slow_down:
            outcome.append(slow_down)

    worker = threading.Thread(target=round_of_two, daemon=True)
    worker.start()
    worker.join(timeout=30)

    assert not worker.is_alive(), f"still asking after {emulator.stats()['rejected_calls']} refusals"
    assert outcome and outcome[0].transient and outcome[0].status == 429
    # 0.05 + 0.1 + 0.2 + 0.2 passes the round's patience: a handful of calls, not a storm.
    assert emulator.stats()["rejected_calls"] <= 6


def test_a_429_that_says_nothing_pauses_the_unit_twice_as_long_each_time_up_to_a_cap(
    build, emulator, monkeypatch
):
    monkeypatch.setattr(module, "FIRST_PAUSE", 0.05)
    monkeypatch.setattr(module, "LONGEST_PAUSE", 0.2)
    monkeypatch.setattr(module, "ROUND_PAUSE_BUDGET", 0.5)
    emulator.configure(requests_per_window=1, window_ms=60_000, window_hint="none")

    stream = build(concurrency=1).results("local-k", requests=requests(2))
    first = next(stream)
    with pytest.raises(SlowDown) as raised:
        next(stream)

    assert first.succeeded and first.custom_id == "bd-0-1"
    calls = emulator.stats()["completion_calls"]
    assert [call["rate_limited"] for call in calls] == [False, True, True, True, True]
    gaps = [later["at"] - earlier["at"] for earlier, later in zip(calls[1:], calls[2:], strict=False)]
    for gap, pause in zip(gaps, [0.05, 0.1, 0.2], strict=True):
        assert gap >= pause
    # 0.05 + 0.1 + 0.2 + 0.2 is more than the round waits: the unit waits out the last pause in
    # the ledger, and the request was never failed.
    assert raised.value.transient and 0 < raised.value.retry_after <= 0.2


@pytest.mark.parametrize("status", [500, 503])
def test_server_errors_are_transient_lines(build, emulator, status):
    emulator.configure(server_errors=1, server_error_status=status)

    lines = collect(build(concurrency=1), requests(2))

    failed = [line for line in lines.values() if not line.succeeded]
    assert [(line.http_status, line.reason, line.transient) for line in failed] == [
        (status, ReasonCode.MODEL_SERVER_ERROR, True)
    ]
    assert failed[0].error_code == "server_error"


def test_a_model_failure_is_a_transient_line_and_nothing_was_generated(build, emulator):
    emulator.configure(fail_rate=1.0)

    lines = collect(build(), requests(3))

    assert {(line.http_status, line.reason, line.transient) for line in lines.values()} == {
        (500, ReasonCode.MODEL_SERVER_ERROR, True)
    }
    assert emulator.stats()["inferences"] == {}


def test_a_refused_request_is_a_permanent_invalid_request(build):
    (line,) = collect(build(), requests(1, model="")).values()

    assert (line.http_status, line.reason, line.transient) == (400, ReasonCode.REQUEST_INVALID, False)
    assert "model" in line.error_message


def test_an_answer_that_is_not_json_or_has_no_choices_is_unreadable_and_permanent(build, emulator):
    emulator.configure(malformed_lines=1, no_choices=1)

    lines = collect(build(concurrency=1), requests(3))

    unreadable = [line for line in lines.values() if not line.succeeded]
    assert len(unreadable) == 2
    assert {(line.reason, line.transient, line.error_code) for line in unreadable} == {
        (ReasonCode.UNREADABLE_RESULT, False, "unreadable_result")
    }
    assert any("502 Bad Gateway" in line.error_message for line in unreadable)


def test_a_lost_answer_is_a_transient_line_for_that_request_only(build, emulator):
    emulator.configure(lose_create_responses=[2])

    lines = collect(build(concurrency=1), requests(3))

    lost = [line for line in lines.values() if not line.succeeded]
    assert [(line.custom_id, line.reason, line.transient, line.error_code) for line in lost] == [
        ("bd-1-1", ReasonCode.MODEL_SERVER_ERROR, True, "connection_lost")
    ]
    assert emulator.stats()["inferences"]["bd-1-1"] == 1  # the work was done; only the answer was lost


def test_a_slow_answer_is_a_transient_timeout(build, emulator):
    emulator.configure(per_request_ms=500)
    provider = build()
    provider.client.timeout = httpx.Timeout(0.1)

    (line,) = collect(provider, requests(1)).values()

    assert (line.reason, line.transient, line.error_code) == (ReasonCode.TIMED_OUT, True, "timeout")


def test_an_unreachable_server_ends_the_round_with_a_transient_error(build):
    provider = build(base_url=dead_url())

    with pytest.raises(ProviderError) as raised:
        list(provider.results("local-k", requests=requests(3)))

    assert raised.value.transient


def test_a_key_is_sent_only_when_configured(build, emulator):
    collect(build(), requests(2))
    assert emulator.stats()["keyed_calls"] == 0

    emulator.configure(api_key="right-key")
    lines = collect(build(key="right-key"), requests(2, prefix="keyed"))

    assert len(lines) == 2 and all(line.succeeded for line in lines.values())
    assert emulator.stats()["keyed_calls"] == 2


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_ends_the_round_with_a_permanent_error_after_one_call_and_is_never_shown(
    build, emulator, status
):
    secret = "sk-local-0123456789abcdefghij"
    if status == 401:
        emulator.configure(api_key="right-key")
    else:
        emulator.configure(refusals=100, refusal_status=403)

    with pytest.raises(ProviderError) as raised:
        list(build(key=secret).results("local-k", requests=requests(5)))

    assert (raised.value.status, raised.value.transient) == (status, False)
    assert str(raised.value).startswith(
        f"The server refuses our key: POST /chat/completions answered {status}"
    )
    assert secret not in str(raised.value)
    if status == 401:
        assert "Incorrect API key" in str(raised.value) and "[redacted]" in str(raised.value)
    # A round begins with one request in flight: one refused call tells, not one per request.
    assert emulator.stats()["refused_keys"] + emulator.stats()["rejected_calls"] == 1
    assert emulator.stats()["inferences"] == {}


def test_a_refusal_every_request_meets_alike_is_the_units_and_fails_none_of_them(build, emulator):
    # A LiteLLM proxy without a database, to a key it cannot check (issue 28 point 7).
    emulator.configure(every_request_refused="No connected db.")
    stream = build(concurrency=4).results("local-k", requests=requests(20))

    with pytest.raises(ProviderError) as raised:
        lines = list(stream)
        pytest.fail(f"yielded {lines}")

    assert (raised.value.status, raised.value.transient) == (400, False)
    assert str(raised.value) == (
        "The server refuses our requests: No connected db. "
        f"(POST /chat/completions answered 400 to {module.REFUSALS_ALIKE} requests in a row)"
    )
    # A round begins with one in flight and adds one per answer: the third refusal stops it, so at
    # most one more call was on its way; never the other sixteen.
    assert module.REFUSALS_ALIKE <= emulator.stats()["refused_requests"] <= module.REFUSALS_ALIKE + 1
    assert emulator.stats()["inferences"] == {}


@pytest.mark.parametrize("count", [2, 3])
def test_a_small_unit_every_request_of_which_is_refused_alike_is_refused(build, emulator, count):
    emulator.configure(every_request_refused="No connected db.", every_request_refused_status=404)

    with pytest.raises(ProviderError) as raised:
        list(build().results("local-k", requests=requests(count)))

    assert (raised.value.status, raised.value.transient) == (404, False)
    assert f"answered 404 to {count} requests in a row" in str(raised.value)


def test_one_request_alone_cannot_tell_and_its_refusal_is_its_own(build, emulator):
    emulator.configure(every_request_refused="No connected db.")

    (line,) = collect(build(), requests(1)).values()

    assert (line.http_status, line.reason, line.transient) == (400, ReasonCode.REQUEST_INVALID, False)
    assert (line.error_code, line.error_message) == ("400", "No connected db.")


def test_a_refusal_among_answers_is_that_requests_own(build, emulator):
    sent = requests(6)
    # The first request asked is the refused one: held until the next answer shows the server serves us.
    emulator.configure(too_long_requests=[sent[0].custom_id])

    lines = collect(build(), sent)

    failed = {custom_id: line for custom_id, line in lines.items() if not line.succeeded}
    assert set(failed) == {sent[0].custom_id} and len(lines) == 6
    (line,) = failed.values()
    assert (line.http_status, line.reason, line.transient) == (400, ReasonCode.REQUEST_INVALID, False)
    assert line.error_message.startswith("This model's maximum context length is 2048 tokens.")


def test_refusals_in_words_of_their_own_are_each_their_requests(build, emulator):
    # Prompts of four lengths, each too long: the server names each one's length.
    sent = [replace(r, user_message=r.user_message + " more" * 20 * n) for n, r in enumerate(requests(4))]
    emulator.configure(too_long_requests=[r.custom_id for r in sent])

    lines = collect(build(concurrency=1), sent)

    assert len(lines) == 4
    assert {(line.reason, line.transient) for line in lines.values()} == {(ReasonCode.REQUEST_INVALID, False)}
    assert len({line.error_message for line in lines.values()}) == 4


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [({"retry-after": "7"}, 7.0), ({"llm_provider-retry-after": "60"}, 60.0), ({}, None)],
)
def test_a_server_error_saying_when_to_come_back_is_retried_then(headers, seconds):
    answer = {"error": {"message": "Service Unavailable", "type": "server_error", "code": "503"}}
    transport = httpx.MockTransport(lambda request: httpx.Response(503, json=answer, headers=headers))
    provider = CompatibleServerProvider(client=httpx.Client(base_url="http://server/v1", transport=transport))

    (line,) = provider.results("local-k", requests=requests(1))

    assert (line.http_status, line.transient, line.retry_after) == (503, True, seconds)


@pytest.mark.parametrize(
    ("status", "answer", "code", "message"),
    [
        # llama.cpp: the HTTP status as `code`, the words in `type`
        (
            400,
            {"error": {"code": 400, "message": "bad schema", "type": "invalid_request_error"}},
            "invalid_request_error",
            "bad schema",
        ),
        # older vLLM: the envelope's keys at the top level
        (
            400,
            {"object": "error", "message": "too long", "type": "BadRequestError", "param": None, "code": 400},
            "BadRequestError",
            "too long",
        ),
        # Ollama: the error as text
        (404, {"error": "model 'x' not found"}, "http_404", "model 'x' not found"),
    ],
)
def test_other_servers_error_shapes_keep_their_words(status, answer, code, message):
    # The emulator speaks OpenAI's envelope only; these are the other servers' shapes, as they send them.
    transport = httpx.MockTransport(lambda request: httpx.Response(status, json=answer))
    provider = CompatibleServerProvider(client=httpx.Client(base_url="http://server/v1", transport=transport))

    (line,) = provider.results("local-k", requests=requests(1))

    assert (line.error_code, line.error_message, line.reason, line.transient) == (
        code,
        message,
        ReasonCode.REQUEST_INVALID,
        False,
    )


# A collector in its own process: records each line the moment it arrives (one line of a file,
# flushed, as the ledger commits one row), skipping what is already recorded.
COLLECTOR = """
import sys, django
django.setup()
import httpx
from ledger.providers.openai_compatible import CompatibleServerProvider
from tests.providers.test_openai_compatible_adapter import requests

base_url, path = sys.argv[1], sys.argv[2]
with open(path) as file:
    recorded = set(file.read().split())
provider = CompatibleServerProvider(client=httpx.Client(base_url=base_url, timeout=10), concurrency=2)
with open(path, "a") as out:
    for line in provider.results("local-k", skip=recorded, requests=requests(20)):
        out.write(line.custom_id + "\\n")
        out.flush()
"""


def test_a_killed_collector_loses_only_the_requests_in_flight(emulator, tmp_path):
    emulator.configure(per_request_ms=100)
    recorded = tmp_path / "recorded"
    recorded.write_text("")
    command = [sys.executable, "-c", COLLECTOR, emulator.base_url, str(recorded)]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "batchdesk.test_settings"}

    first = subprocess.Popen(command, cwd=ROOT, env=env)
    deadline = time.monotonic() + 30
    while len(recorded.read_text().split()) < 6 and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    killed_after = len(recorded.read_text().split())
    subprocess.run(command, cwd=ROOT, env=env, check=True, timeout=60)

    lines = recorded.read_text().split()
    inferences = emulator.stats()["inferences"]
    assert 6 <= killed_after < 20
    assert sorted(lines) == sorted(r.custom_id for r in requests(20))  # each recorded exactly once
    paid_twice = [custom_id for custom_id, times in inferences.items() if times > 1]
    assert len(paid_twice) <= 2  # at most the two that were in flight when the worker died
    assert all(inferences[custom_id] == 1 for custom_id in lines[:killed_after])


# A deployment's process: the adapter built by the registry from settings, which read the
# environment once at start, collecting one unit.
FROM_THE_ENVIRONMENT = """
import django
django.setup()
from ledger.providers import get_provider
from tests.providers.test_openai_compatible_adapter import requests

provider = get_provider("openai_compatible")
lines = list(provider.results("local-k", requests=requests(12)))
assert len(lines) == 12 and all(line.succeeded for line in lines), lines
"""


@pytest.mark.parametrize("concurrency", [1, 3])
def test_openai_compatible_concurrency_in_the_environment_bounds_the_requests_in_flight(
    emulator, concurrency
):
    emulator.configure(per_request_ms=150)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "batchdesk.test_settings",
        "OPENAI_COMPATIBLE_BASE_URL": emulator.base_url,
        "OPENAI_COMPATIBLE_CONCURRENCY": str(concurrency),
    }

    subprocess.run([sys.executable, "-c", FROM_THE_ENVIRONMENT], cwd=ROOT, env=env, check=True, timeout=120)

    stats = emulator.stats()
    assert sum(stats["inferences"].values()) == 12
    # Never more than the setting (the default, 4, would allow more), and as many as it allows.
    assert stats["max_in_flight"] == concurrency
