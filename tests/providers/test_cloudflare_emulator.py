"""The Cloudflare Workers AI batch emulator: its address, envelope and clock, and each knob it
implements, spoken to over real HTTP with a plain client."""

import dataclasses
import json

import httpx
import pytest

from ledger.emulators import emulator_class, textgen
from ledger.emulators.cloudflare import PAYLOAD_LIMIT, CloudflareEmulator, chat_body
from ledger.emulators.knobs import FaultKnobs

ACCOUNT = "smoke0123"
MODEL = "@cf/meta/llama-3.3-70b-instruct-fp8-fast"
QUEUE = f"/accounts/{ACCOUNT}/ai/run/{MODEL}"
SCHEMA = {"type": "object", "properties": {"headline": {"type": "string"}}, "required": ["headline"]}


def entries(n: int, prefix: str = "bd") -> list[dict]:
    return [
        {
            "messages": [
                {"role": "system", "content": "You write product descriptions."},
                {"role": "user", "content": f"Title: Oak stool {i}\n- height: {40 + i} cm"},
            ],
            "max_tokens": 200,
            "response_format": {"type": "json_schema", "json_schema": SCHEMA},
            "external_reference": f"{prefix}-{i}-1",
        }
        for i in range(n)
    ]


@pytest.fixture
def emulator():
    with CloudflareEmulator(per_request_ms=0, queued_ms=0, seed=5) as running:
        yield running


@pytest.fixture
def api(emulator):
    with httpx.Client(
        base_url=emulator.base_url, headers={"Authorization": "Bearer t"}, timeout=30
    ) as client:
        yield client


def queue(api, requests: list[dict]) -> str:
    answer = api.post(QUEUE, params={"queueRequest": "true"}, json={"requests": requests})
    assert answer.status_code == 200, answer.text
    return answer.json()["result"]["request_id"]


def poll(api, request_id: str, path: str = QUEUE) -> httpx.Response:
    return api.post(path, params={"queueRequest": "true"}, json={"request_id": request_id})


def done(api, request_id: str) -> dict:
    result = poll(api, request_id).json()["result"]
    assert "responses" in result, result
    return result


def test_the_real_address_and_envelope(emulator, api):
    answer = api.post(QUEUE, params={"queueRequest": "true"}, json={"requests": entries(1)})

    assert emulator.base_url.endswith("/client/v4")
    assert emulator_class("cloudflare") is CloudflareEmulator
    body = answer.json()
    assert (body["success"], body["errors"], body["messages"]) == (True, [], [])
    assert body["result"]["status"] == "queued" and body["result"]["model"] == MODEL
    assert len(body["result"]["request_id"]) == 36


@pytest.mark.parametrize(
    ("call", "status", "code"),
    [
        (lambda api: httpx.post(api.base_url.join(QUEUE.lstrip("/")), json={"request_id": "x"}), 401, 10000),
        (lambda api: api.post(QUEUE, json={"requests": entries(1)}), 400, 3003),  # no queueRequest
        (lambda api: api.post(QUEUE, params={"queueRequest": "true"}, json={"hello": 1}), 400, 3003),
        (lambda api: api.post(QUEUE, params={"queueRequest": "true"}, json={"requests": []}), 400, 3003),
        (lambda api: api.post(QUEUE, params={"queueRequest": "true"}, json={"requests": ["x"]}), 400, 3003),
        (
            lambda api: api.post(
                f"/accounts/{ACCOUNT}/ai/run/gpt-4o",
                params={"queueRequest": "true"},
                json={"requests": entries(1)},
            ),
            400,
            5007,
        ),
        (lambda api: poll(api, "no-such-request"), 404, 7003),
        (lambda api: api.get(QUEUE), 405, 3003),
    ],
)
def test_errors_use_cloudflares_envelope(api, call, status, code):
    answer = call(api)

    assert answer.status_code == status
    body = answer.json()
    assert body["success"] is False and body["result"] is None
    assert body["errors"][0]["code"] == code and body["errors"][0]["message"]


def test_a_unit_is_found_only_under_its_account_and_model(api):
    request_id = queue(api, entries(1))

    assert poll(api, request_id).status_code == 200
    assert poll(api, request_id, f"/accounts/other/ai/run/{MODEL}").status_code == 404
    assert (
        poll(api, request_id, f"/accounts/{ACCOUNT}/ai/run/@cf/meta/llama-3.1-8b-instruct").status_code == 404
    )


def test_queued_then_running_then_done_as_time_passes(emulator, api):
    emulator.configure(queued_ms=3_600_000)
    request_id = queue(api, entries(3))
    assert poll(api, request_id).json()["result"] == {
        "status": "queued",
        "request_id": request_id,
        "model": MODEL,
    }

    emulator.configure(queued_ms=0, per_request_ms=3_600_000)
    assert poll(api, request_id).json()["result"]["status"] == "running"

    emulator.configure(per_request_ms=0)
    result = done(api, request_id)
    assert set(result) == {"responses", "usage"}


def test_responses_are_shuffled_and_echo_index_and_external_reference(emulator, api):
    sent = entries(30)
    result = done(api, queue(api, sent))

    responses = result["responses"]
    assert [r["id"] for r in responses] != list(range(30))
    assert sorted(r["id"] for r in responses) == list(range(30))
    assert all(r["external_reference"] == sent[r["id"]]["external_reference"] for r in responses)
    assert all(r["success"] is True and isinstance(r["result"]["response"], dict) for r in responses)
    assert emulator.stats()["inferences"] == {e["external_reference"]: 1 for e in sent}
    assert emulator.stats()["batches_by_intent"] == {}


def test_usage_is_aggregated_over_the_unit(api):
    sent = entries(6)
    result = done(api, queue(api, sent))

    usages = [textgen.generate(chat_body(MODEL, entry))[1] for entry in sent]
    prompt = sum(u["prompt_tokens"] for u in usages)
    completion = sum(u["completion_tokens"] for u in usages)
    assert result["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    assert all("usage" not in r for r in result["responses"])


def test_fail_rate_fails_responses_without_inference_or_usage(emulator, api):
    emulator.configure(fail_rate=1.0)
    result = done(api, queue(api, entries(4)))

    assert {(r["success"], r["errors"][0]["code"]) for r in result["responses"]} == {(False, 3040)}
    assert result["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    assert emulator.stats()["inferences"] == {}


def test_fail_rate_is_a_share_drawn_per_custom_id_and_attempt(emulator, api):
    emulator.configure(fail_rate=0.5)
    first = done(api, queue(api, entries(40)))["responses"]
    again = done(api, queue(api, entries(40)))["responses"]

    failed_first = {r["external_reference"] for r in first if not r["success"]}
    failed_again = {r["external_reference"] for r in again if not r["success"]}
    assert 8 <= len(failed_first) <= 32
    assert failed_first != failed_again  # a retried custom_id gets a fresh roll


def test_a_request_that_is_not_text_generation_input_fails_alone(api):
    sent = entries(2) + [{"max_tokens": 5, "external_reference": "bd-bad-1"}]
    result = done(api, queue(api, sent))

    failed = [r for r in result["responses"] if not r["success"]]
    assert [(r["external_reference"], r["errors"][0]["code"]) for r in failed] == [("bd-bad-1", 5004)]


def test_duplicate_unknown_and_malformed_responses(emulator, api):
    emulator.configure(duplicate_lines=1.0, unknown_lines=2, malformed_lines=3)
    sent = entries(4)
    result = done(api, queue(api, sent))

    references = [r.get("external_reference") for r in result["responses"]]
    assert sorted(filter(None, references)) == sorted(
        [e["external_reference"] for e in sent] * 2 + ["unknown-1", "unknown-2"]
    )
    assert sum("external_reference" not in r for r in result["responses"]) == 3
    # Only what was asked for is generated and paid for.
    assert emulator.stats()["inferences"] == {e["external_reference"]: 1 for e in sent}


def test_a_lost_create_answer_still_queues_the_unit(emulator, api):
    emulator.configure(lose_create_responses=[2])
    queue(api, entries(1, "first"))

    with pytest.raises(httpx.TransportError):
        api.post(QUEUE, params={"queueRequest": "true"}, json={"requests": entries(1, "second")})

    stats = emulator.stats()
    assert (stats["creates"], stats["units"]) == (2, 2)
    assert stats["inferences"] == {"first-0-1": 1, "second-0-1": 1}
    queue(api, entries(1, "third"))  # only the second answer was lost


def test_429_storm_with_retry_after_then_5xx_storm(emulator, api):
    emulator.configure(rate_limit_calls=2, retry_after=4, server_errors=1, server_error_status=503)

    answers = [
        api.post(QUEUE, params={"queueRequest": "true"}, json={"requests": entries(1)}) for _ in range(4)
    ]

    assert [a.status_code for a in answers] == [429, 429, 503, 200]
    assert answers[0].headers["retry-after"] == "4"
    assert answers[0].json()["errors"][0]["code"] == 3040 and answers[2].json()["success"] is False
    stats = emulator.stats()
    assert (stats["rejected_calls"], stats["units"]) == (3, 1)


def test_the_ten_megabyte_limit(emulator, api):
    base = len(httpx.Request("POST", "http://x", json={"requests": entries(1)}).content)
    pad = PAYLOAD_LIMIT - base
    at_limit = entries(1)
    at_limit[0]["messages"][1]["content"] += "x" * pad
    over = entries(1)
    over[0]["messages"][1]["content"] += "x" * (pad + 1)

    refused = api.post(QUEUE, params={"queueRequest": "true"}, json={"requests": over})
    accepted = api.post(QUEUE, params={"queueRequest": "true"}, json={"requests": at_limit})

    assert (
        len(refused.request.content) == PAYLOAD_LIMIT + 1 and len(accepted.request.content) == PAYLOAD_LIMIT
    )
    assert refused.status_code == 413 and refused.json()["errors"][0]["code"] == 3006
    assert accepted.status_code == 200
    assert emulator.stats()["units"] == 1


def test_every_common_knob_is_accepted_and_those_that_do_not_apply_change_nothing(emulator, api):
    knobs = {knob.name: getattr(FaultKnobs(), knob.name) for knob in dataclasses.fields(FaultKnobs)}
    with CloudflareEmulator(**knobs) as fresh:
        assert set(knobs) <= set(fresh.config())

    emulator.configure(expire_rate=1.0, expire_after_ms=0, count_mismatch=True, cut_downloads=5)
    result = done(api, queue(api, entries(5)))

    assert all(r["success"] for r in result["responses"]) and len(result["responses"]) == 5
    assert emulator.stats()["downloads"] == {}


def test_the_control_endpoints_use_the_envelope_for_a_bad_knob(emulator):
    base = emulator.base_url.removesuffix("/client/v4")

    bad = httpx.post(f"{base}/_emulator/config", json={"fail_rate": 2})
    good = httpx.post(f"{base}/_emulator/config", json={"queued_ms": 5})

    assert bad.status_code == 400 and bad.json()["success"] is False
    assert good.json()["queued_ms"] == 5


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"], ids=repr)
def test_a_title_holding_a_line_break_other_than_newline_comes_back_in_its_response(api, separator):
    sent = entries(2)
    sent[0]["messages"][1]["content"] = f"Title: Oak{separator}stool\n- height: 40 cm"
    body = json.dumps({"requests": sent}, ensure_ascii=False).encode()  # the separator unescaped

    answer = api.post(QUEUE, params={"queueRequest": "true"}, content=body)
    result = done(api, answer.json()["result"]["request_id"])

    responses = {response["external_reference"]: response for response in result["responses"]}
    assert [responses[ref]["success"] for ref in ("bd-0-1", "bd-1-1")] == [True, True]
    assert f"Oak{separator}stool" in responses["bd-0-1"]["result"]["response"]["headline"]
