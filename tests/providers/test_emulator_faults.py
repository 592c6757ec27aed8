"""The emulator's fault switches over real HTTP: refused, lost and cut calls, spoiled output files,
batches that expire part-way, and the knobs set at run time and on the command line."""

import json
from collections import Counter
from dataclasses import asdict, fields

import httpx
import pytest
from django.core.management import CommandError, call_command
from openai import OpenAI

from ledger.emulators.clock import TestClock
from ledger.emulators.knobs import OpenAIKnobs
from ledger.emulators.openai import Emulator
from ledger.emulators.server import ApiError
from ledger.management.commands.run_emulator import Command as RunEmulator
from ledger.management.commands.run_emulator import emulator_kwargs
from tests.providers.test_emulator import (
    ENDPOINT,
    assert_error_envelope,
    lines,
    results,
    submit,
    upload,
    wait,
)

KNOB_NAMES = [knob.name for knob in fields(OpenAIKnobs)]
TIMINGS = {"per_request_ms": 1, "validating_ms": 20, "finalizing_ms": 5}


@pytest.fixture
def clock():
    return TestClock()


@pytest.fixture
def emulator(clock):
    with Emulator(seed=7, clock=clock, **TIMINGS) as running:
        yield running


@pytest.fixture
def api(emulator):
    with httpx.Client(
        base_url=emulator.base_url, headers={"Authorization": "Bearer test"}, timeout=10
    ) as client:
        yield client


@pytest.fixture
def control(emulator):
    """The emulator's own endpoints, `/_emulator/...`."""
    with httpx.Client(base_url=emulator.base_url.removesuffix("/v1") + "/_emulator", timeout=10) as client:
        yield client


def create_body(input_file: str, intent: str) -> dict:
    return {
        "input_file_id": input_file,
        "endpoint": ENDPOINT,
        "completion_window": "24h",
        "metadata": {"batchdesk_intent": intent},
    }


def test_a_lost_create_answer_still_creates_the_batch(clock, emulator, api):
    input_file = upload(api, lines(3))
    assert api.post("/batches", json=create_body(input_file, "before")).status_code == 200
    # Counted from now: the 1st and 3rd batches created from here on get no answer.
    emulator.configure(lose_create_responses=[1, 3])

    assert_error_envelope(api.post("/batches", json={"endpoint": ENDPOINT}), 400)  # creates nothing
    with pytest.raises(httpx.RemoteProtocolError):
        api.post("/batches", json=create_body(input_file, "lost-1"))
    assert api.post("/batches", json=create_body(input_file, "answered")).status_code == 200
    with pytest.raises(httpx.RemoteProtocolError):
        api.post("/batches", json=create_body(input_file, "lost-2"))
    assert emulator.config()["lose_create_responses"] == []

    listed = api.get("/batches").json()["data"]
    intents = [batch["metadata"]["batchdesk_intent"] for batch in listed]
    assert intents == ["lost-2", "answered", "lost-1", "before"]
    assert wait(clock, api, listed[0]["id"])["status"] == "completed"  # a lost answer is not a lost batch
    stats = emulator.stats()
    assert stats["creates"] == 5 and stats["batches"] == 4
    assert stats["batches_by_intent"] == {"before": 1, "lost-1": 1, "answered": 1, "lost-2": 1}


def test_rate_limited_calls_get_429_with_retry_after_and_create_nothing(emulator, api):
    input_file = upload(api, lines(2))
    emulator.configure(rate_limit_calls=2, rate_limit_path="/v1/batches", retry_after=3)

    assert api.get(f"/files/{input_file}").status_code == 200  # not under the path prefix
    for refused in (api.post("/batches", json=create_body(input_file, "a")), api.get("/batches")):
        assert_error_envelope(refused, 429)
        assert refused.headers["retry-after"] == "3"
        error = refused.json()["error"]
        assert (error["type"], error["code"], error["param"]) == ("requests", "rate_limit_exceeded", None)
        assert error["message"].startswith("Rate limit reached")
    assert api.get("/batches").json()["data"] == []
    assert api.post("/batches", json=create_body(input_file, "a")).status_code == 200

    stats = emulator.stats()
    assert (stats["rejected_calls"], stats["creates"], stats["batches"]) == (2, 2, 1)


def test_server_errors_answer_500_before_doing_anything(emulator, api):
    emulator.configure(server_errors=1)
    assert_error_envelope(
        api.post("/files", files={"file": ("x.jsonl", b"{}")}, data={"purpose": "batch"}), 500
    )
    assert emulator.stats()["files"] == 0

    input_file = upload(api, lines(2))
    emulator.configure(server_errors=1, server_error_path="POST /v1/batches")
    assert api.get("/batches").status_code == 200  # another method
    refused = api.post("/batches", json=create_body(input_file, "a"))
    assert_error_envelope(refused, 500)
    assert refused.json()["error"]["type"] == "server_error"
    assert emulator.stats()["batches"] == 0
    assert api.post("/batches", json=create_body(input_file, "a")).status_code == 200
    assert emulator.stats()["rejected_calls"] == 2


def test_refusals_answer_a_permanent_error_before_doing_anything(emulator, api):
    input_file = upload(api, lines(2))
    emulator.configure(refusals=1, refusal_path="POST /v1/batches")
    assert api.get("/batches").status_code == 200  # another method
    refused = api.post("/batches", json=create_body(input_file, "a"))
    assert_error_envelope(refused, 404)
    emulator.configure(refusals=1, refusal_status=401, refusal_path=None)
    assert_error_envelope(api.get("/batches"), 401)
    assert emulator.stats()["batches"] == 0
    assert api.post("/batches", json=create_body(input_file, "a")).status_code == 200
    assert emulator.stats()["rejected_calls"] == 2


def test_the_official_sdk_waits_out_a_429_and_a_500(emulator):
    emulator.configure(rate_limit_calls=1, server_errors=1, retry_after=0.05)
    client = OpenAI(base_url=emulator.base_url, api_key="test", max_retries=2)

    assert list(client.batches.list()) == []
    assert emulator.stats()["rejected_calls"] == 2


def output_shape(api: httpx.Client, file_id: str) -> list[str]:
    """The output file's custom_ids in order, with `<malformed>` for lines that are not JSON."""
    shape = []
    for text in api.get(f"/files/{file_id}/content").text.splitlines():
        try:
            shape.append(json.loads(text)["custom_id"])
        except ValueError:
            assert text.startswith('{"id": "batch_req_')  # the first half of a line
            shape.append("<malformed>")
    return shape


def test_output_files_can_repeat_invent_and_mangle_lines(clock, emulator, api):
    spoilers = {"duplicate_lines": 0.5, "unknown_lines": 2, "malformed_lines": 3}
    emulator.configure(**spoilers)
    sent = lines(10)
    sent_ids = {r["custom_id"] for r in sent}

    batch = wait(clock, api, submit(api, sent)["id"])
    shape = output_shape(api, batch["output_file_id"])

    seen = Counter(shape)
    assert seen.pop("<malformed>") == 3
    assert seen.pop("unknown-1") == seen.pop("unknown-2") == 1
    assert set(seen) == sent_ids
    repeated = {custom_id for custom_id, times in seen.items() if times > 1}
    assert 0 < len(repeated) < 10 and max(seen.values()) == 2
    texts = api.get(f"/files/{batch['output_file_id']}/content").text.splitlines()
    for custom_id in repeated:
        assert len({text for text, id_ in zip(texts, shape, strict=True) if id_ == custom_id}) == 1
    # The batch itself tells the truth, and made-up lines were never inferences.
    assert batch["request_counts"] == {"total": 10, "completed": 10, "failed": 0}
    assert emulator.stats()["inferences"] == dict.fromkeys(sent_ids, 1)

    # The same seed spoils the same file the same way.
    again_clock = TestClock()
    with Emulator(seed=7, clock=again_clock, **TIMINGS, **spoilers) as again:
        with httpx.Client(base_url=again.base_url, headers={"Authorization": "Bearer t"}) as other:
            rerun = wait(again_clock, other, submit(other, sent)["id"])
            assert output_shape(other, rerun["output_file_id"]) == shape


def test_count_mismatch_reports_more_than_the_files_hold(clock, emulator, api):
    emulator.configure(count_mismatch=True)

    batch = wait(clock, api, submit(api, lines(3))["id"])

    assert batch["request_counts"] == {"total": 3, "completed": 4, "failed": 0}
    assert len(results(api, batch["output_file_id"])) == 3 and batch["error_file_id"] is None


def test_a_cut_download_fails_mid_line_and_the_next_one_is_whole(clock, emulator, api):
    emulator.configure(cut_downloads=1)
    batch = wait(clock, api, submit(api, lines(4))["id"])
    file_id = batch["output_file_id"]
    size = api.get(f"/files/{file_id}").json()["bytes"]

    received = b""
    with pytest.raises(httpx.RemoteProtocolError):
        with api.stream("GET", f"/files/{file_id}/content") as response:
            assert response.status_code == 200 and int(response.headers["content-length"]) == size
            for chunk in response.iter_bytes():
                received += chunk
    assert size / 3 < len(received) < size and not received.endswith(b"\n")

    whole = api.get(f"/files/{file_id}/content").content
    assert len(whole) == size and whole.startswith(received)
    assert len([json.loads(text) for text in whole.splitlines()]) == 4
    assert emulator.stats()["downloads"] == {file_id: 2}


def test_expire_after_ms_expires_a_batch_part_way(clock, emulator, api):
    emulator.configure(per_request_ms=20, expire_after_ms=100)
    sent = lines(20)

    batch = wait(clock, api, submit(api, sent)["id"])
    output, errors = results(api, batch["output_file_id"]), results(api, batch["error_file_id"])

    assert batch["status"] == "expired"
    assert batch["expired_at"] is not None and batch["completed_at"] is None
    assert 1 <= len(output) <= 5 and len(output) + len(errors) == 20
    assert batch["request_counts"] == {"total": 20, "completed": len(output), "failed": len(errors)}
    assert {(e["response"], e["error"]["code"]) for e in errors} == {(None, "batch_expired")}
    # Requests run in input order: the first ones finished, and only they were paid for.
    finished = {f"item-{i}" for i in range(len(output))}
    assert {r["custom_id"] for r in output} == set(emulator.stats()["inferences"]) == finished

    emulator.configure(per_request_ms=1)
    assert wait(clock, api, submit(api, lines(3, prefix="quick"))["id"])["status"] == "completed"


def test_the_knobs_are_shown_and_changed_over_http(emulator, api, control):
    shown = control.get("/config").json()
    assert shown == asdict(OpenAIKnobs()) | {"per_request_ms": 1}
    assert list(shown) == KNOB_NAMES

    changes = {
        "rate_limit_calls": 1,
        "lose_create_responses": [2, 1, 2],
        "unknown_lines": 1,
        "count_mismatch": True,
        "expire_after_ms": 5000,
    }
    changed = control.post("/config", json=changes).json()
    assert changed == shown | changes | {"lose_create_responses": [1, 2]}
    assert control.get("/config").json() == changed == emulator.config()

    assert api.get("/batches").status_code == 429
    now = control.get("/config").json()
    assert now["rate_limit_calls"] == 0  # what is still to come
    assert control.post("/config", json=now).json() == now  # posting back what it shows changes nothing
    assert control.post("/config", json={"expire_after_ms": None}).json()["expire_after_ms"] is None

    stats = control.get("/stats").json()
    assert stats["rejected_calls"] == 1
    assert (stats["creates"], stats["batches_by_intent"], stats["downloads"]) == (0, {}, {})


@pytest.mark.parametrize(
    "bad",
    [
        {"no_such_knob": 1},
        {"rate_limit_calls": -1},
        {"server_errors": 1.5},
        {"lose_create_responses": [0]},
        {"lose_create_responses": 3},
        {"rate_limit_path": "batches"},
        {"count_mismatch": "yes"},
        {"duplicate_lines": 1.5},
        {"expire_after_ms": "soon"},
        {"retry_after": -1},
        {"refusal_status": 500},
        {"refusal_status": 429},
        {"refusal_path": "v1"},
    ],
)
def test_a_bad_knob_gets_a_400_and_changes_nothing(emulator, control, bad):
    before = emulator.config()

    assert_error_envelope(control.post("/config", json={"server_errors": 2, **bad}), 400)

    assert emulator.config() == before


WEBHOOK_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def knobs_from_flags(*flags: str) -> dict:
    parser = RunEmulator().create_parser("manage.py", "run_emulator")
    return emulator_kwargs(vars(parser.parse_args(list(flags))))


def test_the_command_line_flags_become_emulator_knobs():
    kwargs = knobs_from_flags(
        *("--port", "0", "--seed", "3", "--per-request-ms", "5", "--fail-rate", "0.1"),
        *("--expire-rate", "0.2", "--expire-after-ms", "1500", "--lose-create", "1,3"),
        *("--rate-limit", "2", "--rate-limit-path", "/v1/batches", "--retry-after", "5"),
        *("--server-errors", "1", "--server-error-path", "POST /v1/batches", "--cut-downloads", "1"),
        *("--duplicate-rate", "0.25", "--unknown-lines", "2", "--malformed-lines", "1", "--count-mismatch"),
        *("--refusals", "4", "--refusal-path", "/v1/files", "--refusal-status", "403"),
        *("--billing-refusals", "2"),
        *("--truncate-rate", "0.1", "--refuse-rate", "0.2", "--fence-rate", "0.3", "--prose-rate", "0.4"),
        *("--optional-properties", "null"),
        *("--webhook-url", "http://127.0.0.1:9/hooks/openai", "--webhook-secret", WEBHOOK_SECRET),
        *("--webhook-deliveries", "2"),
    )
    emulator = Emulator(**kwargs)

    assert (emulator.host, emulator.port, emulator.seed) == ("127.0.0.1", 0, 3)
    assert emulator.config() == {
        "per_request_ms": 5,
        "fail_rate": 0.1,
        "expire_rate": 0.2,
        "expire_after_ms": 1500,
        "lose_create_responses": [1, 3],
        "rate_limit_calls": 2,
        "rate_limit_path": "/v1/batches",
        "retry_after": 5,
        "server_errors": 1,
        "server_error_path": "POST /v1/batches",
        "server_error_status": 500,
        "refusals": 4,
        "refusal_path": "/v1/files",
        "refusal_status": 403,
        "billing_refusals": 2,
        "duplicate_lines": 0.25,
        "unknown_lines": 2,
        "malformed_lines": 1,
        "count_mismatch": True,
        "cut_downloads": 1,
        "truncate_rate": 0.1,
        "refuse_rate": 0.2,
        "fence_rate": 0.3,
        "prose_rate": 0.4,
        "optional_properties": "null",
        "webhook_url": "http://127.0.0.1:9/hooks/openai",
        "webhook_secret": WEBHOOK_SECRET,
        "webhook_deliveries": 2,
        "strict_schemas": True,
    }


def test_without_fault_flags_every_fault_is_off():
    assert Emulator(**knobs_from_flags()).config() == asdict(OpenAIKnobs())


def test_bad_flags_stop_the_command_before_it_serves():
    with pytest.raises(CommandError, match="lose.create"):
        knobs_from_flags("--lose-create", "0,x")
    with pytest.raises(ApiError):
        Emulator(**knobs_from_flags("--duplicate-rate", "2"))
    with pytest.raises(CommandError, match="duplicate_lines"):
        call_command("run_emulator", "--port", "0", "--duplicate-rate", "2")
