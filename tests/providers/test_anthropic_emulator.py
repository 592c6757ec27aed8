"""The Anthropic emulator over raw HTTP: its protocol and each fault knob it implements."""

import json
import re
from datetime import datetime, timedelta

import httpx
import pytest

from ledger.emulators.anthropic import AnthropicEmulator
from ledger.emulators.clock import TestClock
from ledger.emulators.server import ApiError

HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
BATCH_KEYS = {
    "id",
    "type",
    "processing_status",
    "request_counts",
    "ended_at",
    "created_at",
    "expires_at",
    "archived_at",
    "cancel_initiated_at",
    "results_url",
}


def entry(custom_id: str, **params) -> dict:
    return {
        "custom_id": custom_id,
        "params": {
            "model": "claude-sonnet-4-5",
            "max_tokens": 300,
            "messages": [{"role": "user", "content": f"Title: Lamp {custom_id}\n- colour: red"}],
            **params,
        },
    }


def entries(n: int, prefix: str = "bd") -> list[dict]:
    return [entry(f"{prefix}-{i}-1") for i in range(n)]


@pytest.fixture
def clock():
    return TestClock()


@pytest.fixture
def emulator(clock):
    with AnthropicEmulator(per_request_ms=5, clock=clock) as emu:
        yield emu


@pytest.fixture
def api(emulator):
    with httpx.Client(base_url=emulator.base_url, headers=HEADERS) as client:
        yield client


def create(api, requests: list[dict]) -> dict:
    response = api.post("/v1/messages/batches", json={"requests": requests})
    assert response.status_code == 200, response.text
    return response.json()


def ended(clock, api, batch_id: str) -> dict:
    """The batch once the emulator's clock has moved past every request it holds."""
    clock.advance(seconds=60)
    batch = api.get(f"/v1/messages/batches/{batch_id}").json()
    assert batch["processing_status"] == "ended", batch
    return batch


def results(api, batch: dict) -> list[str]:
    response = api.get(batch["results_url"])
    assert response.status_code == 200
    return response.text.splitlines()


def parsed(api, batch: dict) -> dict[str, dict]:
    return {line["custom_id"]: line["result"] for line in map(json.loads, results(api, batch))}


def assert_rfc3339(value: str) -> None:
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", value), value


def test_base_url_has_no_v1_and_a_batch_has_every_key_of_the_real_one(clock, emulator, api):
    emulator.configure(per_request_ms=50)

    batch = create(api, entries(3))
    done = ended(clock, api, batch["id"])

    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", emulator.base_url)
    assert set(batch) == BATCH_KEYS and set(done) == BATCH_KEYS
    assert (batch["type"], batch["processing_status"]) == ("message_batch", "in_progress")
    assert batch["id"].startswith("msgbatch_")
    assert (batch["results_url"], batch["ended_at"], batch["cancel_initiated_at"], batch["archived_at"]) == (
        None,
        None,
        None,
        None,
    )
    assert batch["request_counts"] == {
        "processing": 3,
        "succeeded": 0,
        "errored": 0,
        "canceled": 0,
        "expired": 0,
    }
    for key in ("created_at", "expires_at"):
        assert_rfc3339(batch[key])
    created = datetime.fromisoformat(batch["created_at"])
    assert datetime.fromisoformat(batch["expires_at"]) - created == timedelta(days=1)
    assert_rfc3339(done["ended_at"])
    assert done["results_url"] == f"{emulator.base_url}/v1/messages/batches/{batch['id']}/results"
    assert done["request_counts"] == {
        "processing": 0,
        "succeeded": 3,
        "errored": 0,
        "canceled": 0,
        "expired": 0,
    }


def test_counts_stay_in_processing_until_the_whole_batch_ends(clock, emulator, api):
    emulator.configure(per_request_ms=300)
    batch = create(api, entries(4))
    clock.advance(ms=350)  # one of four has run

    midway = api.get(f"/v1/messages/batches/{batch['id']}").json()

    assert midway["processing_status"] == "in_progress"
    assert midway["request_counts"]["processing"] == 4 and midway["results_url"] is None


def test_results_are_jsonl_lines_in_the_real_shape(clock, emulator, api):
    batch = ended(
        clock,
        api,
        create(
            api,
            [
                entry("plain"),
                entry(
                    "tool",
                    tools=[
                        {
                            "name": "output",
                            "input_schema": {
                                "type": "object",
                                "properties": {"headline": {"type": "string"}},
                            },
                        }
                    ],
                    tool_choice={"type": "tool", "name": "output"},
                ),
            ],
        )["id"],
    )

    lines = parsed(api, batch)

    plain, tool = lines["plain"]["message"], lines["tool"]["message"]
    assert lines["plain"]["type"] == "succeeded"
    assert (plain["type"], plain["role"], plain["stop_reason"]) == ("message", "assistant", "end_turn")
    assert plain["content"][0]["type"] == "text" and plain["content"][0]["text"]
    assert set(plain["usage"]) >= {"input_tokens", "output_tokens", "service_tier"}
    assert (tool["stop_reason"], tool["content"][0]["type"], tool["content"][0]["name"]) == (
        "tool_use",
        "tool_use",
        "output",
    )
    assert set(tool["content"][0]["input"]) == {"headline"}


@pytest.mark.parametrize(
    ("requests", "said"),
    [
        ([entry("a b")], "custom_id"),
        ([entry("x" * 65)], "custom_id"),
        ([entry("same"), entry("same")], "Duplicate"),
        ([], "at least 1"),
        ([{"custom_id": "a", "params": {"max_tokens": 10, "messages": []}}], "params.model"),
        ([{"custom_id": "a", "params": {"model": "m", "messages": []}}], "params.max_tokens"),
        ([{"custom_id": "a"}], "params"),
    ],
)
def test_an_invalid_batch_is_refused_whole_with_anthropics_envelope(emulator, api, requests, said):
    response = api.post("/v1/messages/batches", json={"requests": requests})

    body = response.json()
    assert response.status_code == 400
    assert set(body) == {"type", "error", "request_id"}
    assert (body["type"], body["error"]["type"]) == ("error", "invalid_request_error")
    assert said in body["error"]["message"]
    assert response.headers["request-id"] == body["request_id"]
    assert api.get("/v1/messages/batches").json()["data"] == []
    assert emulator.stats()["creates"] == 1


def test_more_than_100000_requests_are_refused(api):
    tiny = [
        {"custom_id": f"r{i}", "params": {"model": "m", "max_tokens": 1, "messages": []}}
        for i in range(100_001)
    ]

    response = api.post("/v1/messages/batches", json={"requests": tiny})

    assert response.status_code == 400 and "100000" in response.json()["error"]["message"]


def test_a_call_without_a_key_or_version_is_refused(emulator):
    with httpx.Client(base_url=emulator.base_url) as bare:
        no_key = bare.get("/v1/messages/batches", headers={"anthropic-version": "2023-06-01"})
        no_version = bare.get("/v1/messages/batches", headers={"x-api-key": "k"})
        bearer = bare.get(
            "/v1/messages/batches", headers={"authorization": "Bearer k", "anthropic-version": "x"}
        )

    assert (no_key.status_code, no_key.json()["error"]["type"]) == (401, "authentication_error")
    assert (no_version.status_code, no_version.json()["error"]["type"]) == (400, "invalid_request_error")
    assert bearer.status_code == 200


def test_an_unknown_batch_is_not_found(api):
    response = api.get("/v1/messages/batches/msgbatch_nope")

    assert (response.status_code, response.json()["error"]["type"]) == (404, "not_found_error")


def test_listing_is_newest_first_with_after_id_before_id_and_limit(api):
    ids = [create(api, entries(1, prefix=f"p{n}"))["id"] for n in range(5)]
    newest_first = list(reversed(ids))

    first = api.get("/v1/messages/batches", params={"limit": 2}).json()
    after = api.get("/v1/messages/batches", params={"limit": 2, "after_id": first["last_id"]}).json()
    last = api.get("/v1/messages/batches", params={"limit": 2, "after_id": after["last_id"]}).json()
    before = api.get("/v1/messages/batches", params={"limit": 2, "before_id": ids[0]}).json()

    assert [b["id"] for b in first["data"]] == newest_first[:2] and first["has_more"]
    assert (first["first_id"], first["last_id"]) == (newest_first[0], newest_first[1])
    assert [b["id"] for b in after["data"]] == newest_first[2:4] and after["has_more"]
    assert [b["id"] for b in last["data"]] == newest_first[4:] and not last["has_more"]
    assert [b["id"] for b in before["data"]] == [ids[2], ids[1]] and before["has_more"]
    assert api.get("/v1/messages/batches").json()["has_more"] is False
    for limit in (0, 1001, "many"):
        assert api.get("/v1/messages/batches", params={"limit": limit}).status_code == 400
    assert len(api.get("/v1/messages/batches", params={"limit": 1000}).json()["data"]) == 5


def test_results_before_the_end_are_refused(emulator, api):
    emulator.configure(per_request_ms=1000)
    batch = create(api, entries(1))

    response = api.get(f"/v1/messages/batches/{batch['id']}/results")

    assert response.status_code == 404 and response.json()["type"] == "error"


def test_cancel_goes_canceling_then_ended_with_unrun_requests_canceled(clock, emulator, api):
    emulator.configure(per_request_ms=500, cancel_ms=1000)
    batch = create(api, entries(5))
    clock.advance(ms=600)  # one has run

    canceling = api.post(f"/v1/messages/batches/{batch['id']}/cancel").json()
    again = api.post(f"/v1/messages/batches/{batch['id']}/cancel").json()
    done = ended(clock, api, batch["id"])
    lines = parsed(api, done)
    ran = sorted(cid for cid, result in lines.items() if result["type"] == "succeeded")

    assert canceling["processing_status"] == "canceling" and canceling["cancel_initiated_at"]
    assert again["cancel_initiated_at"] == canceling["cancel_initiated_at"]
    assert ran == ["bd-0-1"]  # nothing runs once the cancel is asked
    assert sorted(result["type"] for result in lines.values()) == ["canceled"] * (5 - len(ran)) + [
        "succeeded"
    ] * len(ran)
    assert done["request_counts"] == {
        "processing": 0,
        "succeeded": len(ran),
        "errored": 0,
        "canceled": 5 - len(ran),
        "expired": 0,
    }
    assert api.post(f"/v1/messages/batches/{batch['id']}/cancel").status_code == 400
    assert emulator.stats()["inferences"] == dict.fromkeys(ran, 1)


def test_delete_only_after_the_end(clock, emulator, api):
    emulator.configure(per_request_ms=500)
    batch = create(api, entries(1))

    early = api.delete(f"/v1/messages/batches/{batch['id']}")
    ended(clock, api, batch["id"])
    deleted = api.delete(f"/v1/messages/batches/{batch['id']}")

    assert early.status_code == 400
    assert deleted.json() == {"id": batch["id"], "type": "message_batch_deleted"}
    assert api.get(f"/v1/messages/batches/{batch['id']}").status_code == 404


def test_lose_create_responses_creates_the_batch_but_drops_the_answer(emulator, api):
    emulator.configure(lose_create_responses=[2])
    create(api, entries(1, prefix="first"))

    with pytest.raises(httpx.TransportError):
        api.post("/v1/messages/batches", json={"requests": entries(2, prefix="second")})

    listed = api.get("/v1/messages/batches").json()["data"]
    assert [sum(b["request_counts"].values()) for b in listed] == [2, 1]
    assert emulator.config()["lose_create_responses"] == []


def test_a_429_storm_carries_retry_after_and_anthropics_rate_limit_error(emulator, api):
    emulator.configure(rate_limit_calls=2, rate_limit_path="POST /v1/messages/batches", retry_after=4)

    refused = [api.post("/v1/messages/batches", json={"requests": entries(1)}) for _ in range(2)]
    listing = api.get("/v1/messages/batches")
    accepted = api.post("/v1/messages/batches", json={"requests": entries(1)})

    assert [(r.status_code, r.headers["retry-after"], r.json()["error"]["type"]) for r in refused] == [
        (429, "4", "rate_limit_error")
    ] * 2
    assert (listing.status_code, accepted.status_code) == (200, 200)
    assert emulator.stats()["rejected_calls"] == 2


def test_a_529_storm_answers_overloaded_error(emulator, api):
    emulator.configure(server_errors=1, server_error_status=529)

    overloaded = api.get("/v1/messages/batches")
    after = api.get("/v1/messages/batches")

    assert (overloaded.status_code, overloaded.json()["error"]["type"]) == (529, "overloaded_error")
    assert after.status_code == 200


def test_fail_rate_writes_errored_api_error_lines_never_paid_for(clock, emulator, api):
    emulator.configure(fail_rate=0.5)
    batch = ended(clock, api, create(api, entries(20))["id"])

    lines = parsed(api, batch)
    errored = {cid for cid, result in lines.items() if result["type"] == "errored"}

    assert 3 <= len(errored) <= 17
    assert {lines[cid]["error"]["error"]["type"] for cid in errored} == {"api_error"}
    assert {lines[cid]["error"]["type"] for cid in errored} == {"error"}
    assert batch["request_counts"]["errored"] == len(errored)
    assert set(emulator.stats()["inferences"]) == set(lines) - errored


def test_a_retried_custom_id_gets_a_fresh_roll_of_the_dice(clock, emulator, api):
    emulator.configure(fail_rate=0.5)
    first = parsed(api, ended(clock, api, create(api, entries(20))["id"]))
    second = parsed(api, ended(clock, api, create(api, entries(20))["id"]))

    assert [r["type"] for r in first.values()] != [second[cid]["type"] for cid in first]


def test_expire_rate_writes_expired_lines(clock, emulator, api):
    emulator.configure(expire_rate=1.0)
    batch = ended(clock, api, create(api, entries(3))["id"])

    assert {result["type"] for result in parsed(api, batch).values()} == {"expired"}
    assert batch["request_counts"]["expired"] == 3


def test_expire_after_ms_expires_what_has_not_run(clock, emulator, api):
    emulator.configure(per_request_ms=50, expire_after_ms=120)
    batch = ended(clock, api, create(api, entries(5))["id"])

    lines = parsed(api, batch)

    assert [lines[f"bd-{i}-1"]["type"] for i in range(5)] == ["succeeded"] * 2 + ["expired"] * 3
    assert batch["request_counts"] == {
        "processing": 0,
        "succeeded": 2,
        "errored": 0,
        "canceled": 0,
        "expired": 3,
    }


def test_duplicate_unknown_and_malformed_lines(clock, emulator, api):
    emulator.configure(duplicate_lines=1.0, unknown_lines=2, malformed_lines=1)
    batch = ended(clock, api, create(api, entries(3))["id"])

    texts = results(api, batch)
    readable = []
    for text in texts:
        try:
            readable.append(json.loads(text)["custom_id"])
        except ValueError:
            readable.append(None)

    assert sorted(filter(None, readable)) == sorted(
        ["bd-0-1", "bd-1-1", "bd-2-1"] * 2 + ["unknown-1", "unknown-2"]
    )
    assert readable.count(None) == 1
    assert emulator.stats()["inferences"] == {"bd-0-1": 1, "bd-1-1": 1, "bd-2-1": 1}


def test_count_mismatch_claims_one_success_more_than_the_results_hold(clock, emulator, api):
    emulator.configure(count_mismatch=True)
    batch = ended(clock, api, create(api, entries(3))["id"])

    assert batch["request_counts"]["succeeded"] == 4
    assert len(results(api, batch)) == 3


def test_cut_downloads_cuts_the_first_download_of_the_results_mid_line(clock, emulator, api):
    emulator.configure(cut_downloads=1)
    batch = ended(clock, api, create(api, entries(6))["id"])

    with pytest.raises(httpx.TransportError):
        api.get(batch["results_url"])
    whole = results(api, batch)

    assert len(whole) == 6
    assert emulator.stats()["downloads"] == {batch["id"]: 2}


def test_the_same_seed_writes_the_same_results_file():
    files = []
    for _ in range(2):
        clock = TestClock()
        with AnthropicEmulator(
            per_request_ms=1, seed=7, duplicate_lines=0.3, unknown_lines=1, clock=clock
        ) as emu:
            with httpx.Client(base_url=emu.base_url, headers=HEADERS) as api:
                batch = ended(clock, api, create(api, entries(10))["id"])
                files.append([json.loads(text)["custom_id"] for text in results(api, batch)])

    assert files[0] == files[1] and files[0] != sorted(files[0])


def test_evidence_counts_inferences_and_has_no_intents(clock, emulator, api):
    ended(clock, api, create(api, entries(2))["id"])

    stats = api.get("/_emulator/stats").json()

    assert stats["inferences"] == {"bd-0-1": 1, "bd-1-1": 1}
    assert stats["batches_by_intent"] == {}
    assert stats["creates"] == 1


def test_knobs_are_checked_and_set_over_http(emulator, api):
    refused = api.post("/_emulator/config", json={"fail_rate": 2})
    unknown = api.post("/_emulator/config", json={"no_such_knob": 1})
    accepted = api.post("/_emulator/config", json={"server_error_status": 529})

    assert (refused.status_code, refused.json()["error"]["type"]) == (400, "invalid_request_error")
    assert unknown.status_code == 400
    assert accepted.json()["server_error_status"] == 529
    with pytest.raises(ApiError):
        AnthropicEmulator(expire_rate=-1)
