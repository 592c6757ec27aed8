"""The compatible-server emulator's knobs, each seen from outside over real HTTP."""

import json
import threading
import time
from dataclasses import asdict

import httpx
import pytest

from ledger.emulators import emulator_class
from ledger.emulators.openai_compatible import CompatibleServerEmulator
from ledger.emulators.server import ApiError, FaultKnobs

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


@pytest.mark.parametrize(
    ("change", "param"),
    [({"model": ""}, "model"), ({"messages": []}, "messages"), ({"stream": True}, "stream")],
)
def test_a_bad_request_is_400_in_openai_envelope(emulator, client, change, param):
    response = client.post("/chat/completions", json={**body(), **change})

    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert emulator.stats()["inferences"] == {}


def test_a_bad_knob_is_refused(emulator):
    with pytest.raises(ApiError):
        emulator.configure(api_key="")
    with pytest.raises(ApiError):
        emulator.configure(no_choices=-1)
