"""The compatible-server emulator's knobs, each seen from outside over real HTTP."""

import json
import threading
import time
from dataclasses import asdict
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx
import pytest

from ledger.emulators import emulator_class
from ledger.emulators.knobs import FaultKnobs
from ledger.emulators.openai_compatible import CompatibleServerEmulator
from ledger.emulators.server import ApiError
from ledger.management.commands.run_emulator import SERVER_KNOBS, emulator_kwargs
from ledger.management.commands.run_emulator import Command as RunEmulator
from ledger.retrying import requested_wait

SCHEMA = {
    "type": "object",
    "properties": {"headline": {"type": "string"}},
    "required": ["headline"],
    "additionalProperties": False,
}


def body(title: str = "Oak table", **extra) -> dict:
    return {
        "model": "llama-3.1-8b",
        "messages": [
            {"role": "system", "content": "You write product copy."},
            {"role": "user", "content": f"Title: {title}\n- wood: oak"},
        ],
        **extra,
    }


@pytest.fixture
def emulator():
    with CompatibleServerEmulator(per_request_ms=10, seed=2) as running:
        yield running


@pytest.fixture
def client(emulator):
    with httpx.Client(base_url=emulator.base_url, timeout=10) as client:
        yield client


def ask(client, custom_id: str = "bd-1-1", **extra) -> httpx.Response:
    return client.post("/chat/completions", json=body(**extra), headers={"X-Request-Id": custom_id})


def test_registered_under_its_protocol_and_takes_every_common_knob():
    assert emulator_class("openai_compatible") is CompatibleServerEmulator
    # The knobs that do not apply (expiry, repeated / unknown lines, cut downloads) are accepted.
    every = {**asdict(FaultKnobs()), "expire_rate": 0.5, "duplicate_lines": 0.5, "cut_downloads": 2}
    with CompatibleServerEmulator(**every) as emulator:
        assert emulator.base_url.endswith("/v1")
        assert set(every) <= set(emulator.config())


def test_a_completion_in_openai_shape_counted_by_custom_id(emulator, client):
    response = ask(
        client, "bd-7-1", response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}}
    )

    answer = response.json()
    assert response.status_code == 200 and response.headers["X-Request-Id"] == "bd-7-1"
    assert answer["object"] == "chat.completion" and answer["model"] == "llama-3.1-8b"
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert set(json.loads(answer["choices"][0]["message"]["content"])) == {"headline"}
    assert (
        answer["usage"]["total_tokens"]
        == answer["usage"]["prompt_tokens"] + answer["usage"]["completion_tokens"]
    )
    ask(client, "bd-7-1")
    assert emulator.stats()["inferences"] == {"bd-7-1": 2}


def test_a_token_budget_cuts_the_answer_short(client):
    answer = ask(client, max_tokens=3).json()

    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 3


def test_models_are_listed(client):
    ask(client)
    listing = client.get("/models").json()

    assert listing["object"] == "list"
    assert {"emulated-model", "llama-3.1-8b"} <= {model["id"] for model in listing["data"]}


def test_per_request_ms_is_real_time_and_max_in_flight_is_measured(emulator, client):
    emulator.configure(per_request_ms=200)
    threads = [threading.Thread(target=ask, args=(client, f"bd-{n}-1")) for n in range(3)]

    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started

    stats = emulator.stats()
    assert elapsed >= 0.2  # each answer takes 200 ms of real time
    assert (stats["max_in_flight"], stats["in_flight"]) == (3, 0)


def test_fail_rate_answers_500_before_any_work(emulator, client):
    emulator.configure(fail_rate=1.0)

    response = ask(client)

    assert response.status_code == 500
    assert response.json()["error"]["type"] == "server_error"
    assert emulator.stats()["inferences"] == {}


def test_fail_rate_is_drawn_per_custom_id_and_attempt(emulator, client):
    emulator.configure(fail_rate=0.5)
    first = [ask(client, f"bd-{n}-1").status_code for n in range(20)]

    with CompatibleServerEmulator(per_request_ms=0, seed=2, fail_rate=0.5) as again:
        with httpx.Client(base_url=again.base_url) as other:
            second = [ask(other, f"bd-{n}-1").status_code for n in range(20)]

    assert first == second and {200, 500} == set(first)


def test_a_lost_answer_is_computed_and_counted_but_never_arrives(emulator, client):
    emulator.configure(lose_create_responses=[2])

    assert ask(client, "bd-1-1").status_code == 200
    with pytest.raises(httpx.TransportError):
        ask(client, "bd-2-1")
    assert ask(client, "bd-3-1").status_code == 200
    assert emulator.stats()["inferences"] == {"bd-1-1": 1, "bd-2-1": 1, "bd-3-1": 1}


def test_malformed_answers_are_not_json(emulator, client):
    emulator.configure(malformed_lines=2)

    answers = [ask(client, f"bd-{n}-1") for n in range(3)]

    assert [a.status_code for a in answers] == [200, 200, 200]
    for answer in answers[:2]:
        with pytest.raises(ValueError):
            answer.json()
    assert answers[2].json()["choices"]
    assert len(emulator.stats()["inferences"]) == 3  # computed, then spoiled on the way


def test_no_choices_answers_are_json_without_choices(emulator, client):
    emulator.configure(no_choices=1)

    assert ask(client, "bd-1-1").json()["choices"] == []
    assert ask(client, "bd-2-1").json()["choices"]


def test_a_429_storm_carries_retry_after(emulator, client):
    emulator.configure(rate_limit_calls=2, retry_after=7)

    statuses = [ask(client, f"bd-{n}-1") for n in range(3)]

    assert [s.status_code for s in statuses] == [429, 429, 200]
    assert statuses[0].headers["retry-after"] == "7"
    assert statuses[0].json()["error"]["type"] == "rate_limit_error"
    assert emulator.stats()["rejected_calls"] == 2


def test_a_server_error_storm_with_its_status(emulator, client):
    emulator.configure(server_errors=1, server_error_status=503)

    assert [ask(client).status_code for _ in range(2)] == [503, 200]


def test_an_api_key_when_set_is_required(emulator, client):
    assert ask(client).status_code == 200  # no key at all, as most self-hosted servers run

    emulator.configure(api_key="local-key")
    refused = ask(client)
    wrong = client.post("/chat/completions", json=body(), headers={"Authorization": "Bearer nope"})
    right = client.post("/chat/completions", json=body(), headers={"Authorization": "Bearer local-key"})

    assert (refused.status_code, wrong.status_code, right.status_code) == (401, 401, 200)
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert emulator.stats()["keyed_calls"] == 2
    assert emulator.stats()["refused_keys"] == 2


@pytest.mark.parametrize(
    "hint",
    [
        "retry-after",
        "retry-after-ms",
        "http-date",
        "llm_provider-retry-after",
        "x-ratelimit-reset-requests",
        "none",
    ],
)
def test_a_rate_limit_of_n_requests_per_window_answers_429_saying_when_to_come_back(emulator, client, hint):
    emulator.configure(requests_per_window=2, window_ms=5_000, window_hint=hint)

    answers = [ask(client, f"bd-{n}-1") for n in range(3)]

    assert [answer.status_code for answer in answers] == [200, 200, 429]
    refused = answers[2]
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert emulator.stats()["inferences"] == {"bd-0-1": 1, "bd-1-1": 1}  # refused before any work
    calls = emulator.stats()["completion_calls"]
    assert [(call["custom_id"], call["rate_limited"]) for call in calls] == [
        ("bd-0-1", False),
        ("bd-1-1", False),
        ("bd-2-1", True),
    ]
    assert emulator.stats()["rate_limited_calls"] == 1
    retry_at = calls[2]["retry_at"]
    # When the first call leaves the window, give or take the rounding the header forces.
    window_ends = calls[0]["at"] + 5
    if hint == "retry-after":
        assert refused.headers["retry-after"] == "5" and "retry-after-ms" not in refused.headers
        assert retry_at == calls[2]["at"] + 5
    elif hint == "retry-after-ms":
        wait = int(refused.headers["retry-after-ms"])
        assert 4_000 < wait <= 5_000 and "retry-after" not in refused.headers
        assert retry_at == calls[2]["at"] + wait / 1000 >= window_ends
    elif hint == "http-date":
        come_back = parsedate_to_datetime(refused.headers["retry-after"])
        assert 4 < (come_back - datetime.now(UTC)).total_seconds() <= 6
        assert retry_at >= window_ends
    elif hint == "llm_provider-retry-after":
        # A LiteLLM proxy passing on its provider's Retry-After, and saying nothing itself.
        assert refused.headers["llm_provider-retry-after"] == "5" and "retry-after" not in refused.headers
        assert retry_at == calls[2]["at"] + 5
    elif hint == "x-ratelimit-reset-requests":
        said = refused.headers["x-ratelimit-reset-requests"]
        assert said.endswith("s") and refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert 4 < requested_wait(refused.headers) <= 5
        assert retry_at >= window_ends
    else:
        assert "retry-after" not in refused.headers and "retry-after-ms" not in refused.headers
        assert retry_at is None


def test_the_window_slides_and_a_refused_call_does_not_count(emulator, client):
    emulator.configure(requests_per_window=1, window_ms=200, window_hint="retry-after-ms")

    first = ask(client, "bd-0-1")
    refused = ask(client, "bd-1-1")
    time.sleep(int(refused.headers["retry-after-ms"]) / 1000)
    again = ask(client, "bd-1-1")

    assert (first.status_code, refused.status_code, again.status_code) == (200, 429, 200)


@pytest.mark.parametrize(
    ("change", "param"),
    [({"model": ""}, "model"), ({"messages": []}, "messages"), ({"stream": True}, "stream")],
)
def test_a_bad_request_is_400_in_openai_envelope(emulator, client, change, param):
    response = client.post("/chat/completions", json={**body(), **change})

    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert emulator.stats()["inferences"] == {}


def test_every_request_refused_answers_every_call_alike_until_switched_off(emulator, client):
    emulator.configure(every_request_refused="No connected db.")

    answers = [ask(client, f"bd-{n}-1") for n in range(3)] + [client.get("/models")]

    # LiteLLM's proxy without a database, to a key it cannot check: 400, the status as the code.
    assert {answer.status_code for answer in answers} == {400}
    assert {json.dumps(answer.json()["error"]) for answer in answers} == {
        json.dumps(
            {"message": "No connected db.", "type": "invalid_request_error", "param": None, "code": "400"}
        )
    }
    assert emulator.stats()["refused_requests"] == 4
    assert emulator.stats()["inferences"] == {}

    emulator.configure(every_request_refused=None)
    assert ask(client, "bd-0-1").status_code == 200


def test_too_long_requests_are_refused_each_in_words_of_its_own(emulator, client):
    emulator.configure(too_long_requests=["bd-1-1", "bd-2-1"])

    answers = {n: ask(client, f"bd-{n}-1", title="x" * 40 * n) for n in range(4)}

    assert {n: answer.status_code for n, answer in answers.items()} == {0: 200, 1: 400, 2: 400, 3: 200}
    said = [answers[n].json()["error"]["message"] for n in (1, 2)]
    assert all(words.startswith("This model's maximum context length is 2048 tokens.") for words in said)
    assert said[0] != said[1]  # each request's own length
    assert set(emulator.stats()["inferences"]) == {"bd-0-1", "bd-3-1"}


def test_a_bad_knob_is_refused(emulator):
    with pytest.raises(ApiError):
        emulator.configure(api_key="")
    with pytest.raises(ApiError):
        emulator.configure(no_choices=-1)
    for bad in (
        {"requests_per_window": -1},
        {"window_ms": 0},
        {"window_hint": "soon"},
        {"every_request_refused": ""},
        {"every_request_refused_status": 429},
        {"too_long_requests": "bd-1-1"},
        {"too_long_requests": [""]},
    ):
        with pytest.raises(ApiError):
            emulator.configure(**bad)
    assert emulator.config()["window_hint"] == "retry-after"


def test_the_command_line_flags_set_the_servers_own_knobs():
    parser = RunEmulator().create_parser("manage.py", "run_emulator")
    flags = ["--protocol", "openai_compatible", "--port", "0", "--api-key", "local-key"]
    flags += ["--requests-per-window", "3", "--window-ms", "60000", "--window-hint", "none"]
    flags += ["--every-request-refused", "No connected db.", "--every-request-refused-status", "404"]
    flags += ["--too-long-requests", "bd-1-1,bd-2-1"]

    kwargs = emulator_kwargs(vars(parser.parse_args(flags)))

    config = CompatibleServerEmulator(**kwargs).config()
    assert {name: config[name] for name in SERVER_KNOBS} == {
        "api_key": "local-key",
        "requests_per_window": 3,
        "window_ms": 60_000,
        "window_hint": "none",
        "every_request_refused": "No connected db.",
        "every_request_refused_status": 404,
        "too_long_requests": ["bd-1-1", "bd-2-1"],
    }
    # Not given: the server's defaults, and another protocol is not handed knobs it lacks.
    assert not set(SERVER_KNOBS) & set(emulator_kwargs(vars(parser.parse_args(["--port", "0"]))))
    with pytest.raises(ApiError, match="requests_per_window"):
        emulator_class("openai")(**emulator_kwargs(vars(parser.parse_args(["--requests-per-window", "3"]))))
