"""The Anthropic adapter against the Anthropic emulator, over real HTTP."""

import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from ledger.emulators.anthropic import AnthropicEmulator
from ledger.emulators.clock import TestClock
from ledger.providers import anthropic as adapter_module
from ledger.providers import get_provider
from ledger.providers.anthropic import AnthropicBatchProvider, batch_request, parse_result_line
from ledger.providers.base import (
    AnswerLost,
    Delivery,
    Finding,
    InferenceRequest,
    ProviderError,
    ResultLine,
    UnitCounts,
    UnreadableLine,
)
from ledger.states import ReasonCode

KEY = "sk-ant-api03-testkey0123456789abcdefXYZ"
SCHEMA = {
    "type": "object",
    "properties": {"headline": {"type": "string"}, "description": {"type": "string"}},
    "required": ["headline", "description"],
    "additionalProperties": False,
}


def requests(n: int, prefix: str = "bd", schema: dict | None = SCHEMA) -> list[InferenceRequest]:
    return [
        InferenceRequest(
            custom_id=f"{prefix}-{i}-1",
            model="claude-sonnet-4-5",
            system_message="You write product descriptions.",
            user_message=f"Write a description.\nTitle: Beech spoon {i}\n- material: beech\n- length: {20 + i} cm",
            output_schema=schema,
            max_output_tokens=400,
        )
        for i in range(n)
    ]


@pytest.fixture
def clock():
    return TestClock()


@pytest.fixture
def emulator(clock):
    with AnthropicEmulator(per_request_ms=5, clock=clock) as emu:
        yield emu


@pytest.fixture
def provider(emulator, settings, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    settings.PROVIDERS = {
        **settings.PROVIDERS,
        "anthropic": {**settings.PROVIDERS["anthropic"], "base_url": emulator.base_url},
    }
    return get_provider("anthropic")


def run_to_end(clock, provider, ref):
    """The unit's status once the emulator's clock has moved past every request it holds."""
    clock.advance(seconds=60)
    status = provider.status(ref)
    assert status.ended, status
    return status


def by_id(lines) -> dict[str, ResultLine]:
    return {line.custom_id: line for line in lines if isinstance(line, ResultLine)}


def test_capabilities_say_found_by_listing_cancellable_and_file_delivered():
    capabilities = AnthropicBatchProvider.capabilities
    assert capabilities.finding == Finding.BY_LISTING
    assert capabilities.can_cancel
    assert capabilities.max_requests == 100_000
    assert capabilities.max_bytes == 256 * 1024 * 1024
    assert capabilities.delivery == Delivery.FILE
    assert capabilities.usage_per_request


def test_submit_poll_and_stream_results_matched_by_custom_id(clock, emulator, provider):
    emulator.configure(per_request_ms=50)
    sent = requests(8)
    ref = provider.submit(requests=sent, intent_key="bd_intent_1", metadata={"job": "j"})

    running = provider.status(ref)
    status = run_to_end(clock, provider, ref)
    lines = list(provider.results(ref))

    assert ref.startswith("msgbatch_")
    assert (running.provider_status, running.ended) == ("in_progress", False)
    assert running.counts == UnitCounts(total=8, succeeded=0, failed=0)  # all `processing`
    assert (status.provider_status, status.ended, status.refused) == ("ended", True, False)
    assert status.counts == UnitCounts(total=8, succeeded=8, failed=0)
    assert sorted(line.custom_id for line in lines) == sorted(r.custom_id for r in sent)
    for line in lines:
        # The forced `output` tool's input, as JSON text matching the schema.
        assert isinstance(line, ResultLine) and line.succeeded
        assert set(json.loads(line.content)) == {"headline", "description"}
        assert line.input_tokens > 0 and line.output_tokens > 0
        assert line.usage["service_tier"] == "batch"
    assert emulator.stats()["inferences"] == {r.custom_id: 1 for r in sent}


def test_without_a_schema_the_text_blocks_are_the_content(clock, provider):
    ref = provider.submit(requests=requests(2, schema=None), intent_key="bd_text", metadata={})
    run_to_end(clock, provider, ref)

    lines = list(provider.results(ref))

    assert len(lines) == 2
    assert all(
        line.succeeded and line.content.startswith(("Introducing", "Meet", "Say", "Discover"))
        for line in lines
    )


def test_a_request_forces_the_output_tool_only_with_a_schema():
    with_schema, without = requests(1)[0], requests(1, schema=None)[0]

    params = batch_request(with_schema)["params"]

    assert params["tools"] == [
        {"name": "output", "description": params["tools"][0]["description"], "input_schema": SCHEMA}
    ]
    assert params["tool_choice"] == {"type": "tool", "name": "output"}
    assert params["system"] == with_schema.system_message
    assert params["messages"] == [{"role": "user", "content": with_schema.user_message}]
    assert params["max_tokens"] == 400
    assert "tools" not in batch_request(without)["params"]


def test_request_bytes_add_up_to_about_the_create_body(provider):
    sent = requests(5)

    counted = sum(provider.request_bytes(r) for r in sent)
    body = json.dumps({"requests": [batch_request(r) for r in sent]}, ensure_ascii=False).encode()

    assert abs(counted - len(body)) <= 20


def test_errored_requests_are_server_errors_and_transient(clock, emulator, provider):
    emulator.configure(fail_rate=1.0)
    ref = provider.submit(requests=requests(3), intent_key="bd_fail", metadata={})

    status = run_to_end(clock, provider, ref)
    lines = list(provider.results(ref))

    assert status.counts == UnitCounts(total=3, succeeded=0, failed=3)
    assert {(line.error_code, line.reason, line.transient, line.http_status) for line in lines} == {
        ("api_error", ReasonCode.MODEL_SERVER_ERROR, True, 500)
    }
    assert emulator.stats()["inferences"] == {}


def test_expired_requests_are_batch_expired_and_transient(clock, emulator, provider):
    emulator.configure(expire_rate=1.0)
    ref = provider.submit(requests=requests(2), intent_key="bd_expire", metadata={})
    run_to_end(clock, provider, ref)

    lines = list(provider.results(ref))

    assert {(line.error_code, line.reason, line.transient) for line in lines} == {
        ("expired", ReasonCode.BATCH_EXPIRED, True)
    }


def test_a_batch_out_of_time_part_way_keeps_what_ran_and_expires_the_rest(clock, emulator, provider):
    emulator.configure(per_request_ms=50, expire_after_ms=120)
    ref = provider.submit(requests=requests(6), intent_key="bd_part", metadata={})

    status = run_to_end(clock, provider, ref)
    lines = by_id(provider.results(ref))

    assert status.counts == UnitCounts(total=6, succeeded=2, failed=4)
    assert [lines[f"bd-{i}-1"].succeeded for i in range(6)] == [True, True, False, False, False, False]
    assert {lines[f"bd-{i}-1"].reason for i in range(2, 6)} == {ReasonCode.BATCH_EXPIRED}


def test_an_invalid_request_inside_a_batch_is_permanent(clock, emulator, provider):
    # Anthropic checks model and max_tokens at create; the rest fails the one request.
    with httpx.Client(
        base_url=emulator.base_url, headers={"x-api-key": "k", "anthropic-version": "2023-06-01"}
    ) as raw:
        bad = {"custom_id": "bd-bad-1", "params": {"model": "m", "max_tokens": 10, "messages": []}}
        ref = raw.post("/v1/messages/batches", json={"requests": [bad]}).json()["id"]
    run_to_end(clock, provider, ref)

    (line,) = provider.results(ref)

    assert (line.succeeded, line.error_code, line.reason, line.transient, line.http_status) == (
        False,
        "invalid_request_error",
        ReasonCode.REQUEST_INVALID,
        False,
        400,
    )
    assert "messages" in line.error_message


@pytest.mark.parametrize(
    ("error_type", "reason", "transient"),
    [
        ("rate_limit_error", ReasonCode.RATE_LIMITED, True),
        ("overloaded_error", ReasonCode.MODEL_SERVER_ERROR, True),
        ("api_error", ReasonCode.MODEL_SERVER_ERROR, True),
        ("timeout_error", ReasonCode.TIMED_OUT, True),
        ("invalid_request_error", ReasonCode.REQUEST_INVALID, False),
        ("permission_error", ReasonCode.REQUEST_INVALID, False),
        ("billing_error", ReasonCode.REQUEST_INVALID, False),
        ("something_new_error", ReasonCode.MODEL_FAILED, False),
    ],
)
def test_each_error_type_of_an_errored_line_is_classified(error_type, reason, transient):
    envelope = {"type": "error", "error": {"type": error_type, "message": "no"}, "request_id": "req_1"}
    text = json.dumps({"custom_id": "bd-1-1", "result": {"type": "errored", "error": envelope}})

    line = parse_result_line(1, text)

    assert (line.succeeded, line.error_code, line.reason, line.transient) == (
        False,
        error_type,
        reason,
        transient,
    )


def test_canceled_lines_are_permanent_and_odd_lines_never_raise():
    canceled = parse_result_line(1, '{"custom_id": "bd-1-1", "result": {"type": "canceled"}}')
    odd_type = parse_result_line(2, '{"custom_id": "bd-2-1", "result": {"type": "vanished"}}')
    no_message = parse_result_line(3, '{"custom_id": "bd-3-1", "result": {"type": "succeeded"}}')
    not_json = parse_result_line(4, '{"custom_id": "bd-4-')
    no_id = parse_result_line(5, '{"result": {"type": "canceled"}}')

    assert (canceled.reason, canceled.transient, canceled.error_code) == (
        ReasonCode.MODEL_FAILED,
        False,
        "canceled",
    )
    assert (odd_type.reason, odd_type.transient) == (ReasonCode.UNREADABLE_RESULT, False)
    assert (no_message.succeeded, no_message.reason) == (False, ReasonCode.UNREADABLE_RESULT)
    assert isinstance(not_json, UnreadableLine) and not_json.line_number == 4
    assert isinstance(no_id, UnreadableLine) and no_id.problem == "no custom_id"


def test_repeated_unknown_and_malformed_lines_reach_the_ledger_as_such(clock, emulator, provider):
    emulator.configure(duplicate_lines=1.0, unknown_lines=2, malformed_lines=1)
    ref = provider.submit(requests=requests(3), intent_key="bd_spoiled", metadata={})
    run_to_end(clock, provider, ref)

    lines = list(provider.results(ref))
    ids = sorted(line.custom_id for line in lines if isinstance(line, ResultLine))

    assert ids == sorted(
        ["bd-0-1", "bd-0-1", "bd-1-1", "bd-1-1", "bd-2-1", "bd-2-1", "unknown-1", "unknown-2"]
    )
    assert [type(line) for line in lines].count(UnreadableLine) == 1


def test_a_cut_download_raises_after_the_lines_it_read_and_the_next_try_reads_all(clock, emulator, provider):
    emulator.configure(cut_downloads=1)
    ref = provider.submit(requests=requests(6), intent_key="bd_cut", metadata={})
    run_to_end(clock, provider, ref)

    read = []
    with pytest.raises(ProviderError) as raised:
        for line in provider.results(ref):
            read.append(line)
    again = list(provider.results(ref))

    assert raised.value.transient
    assert 0 < len(read) < 6 and all(isinstance(line, ResultLine) for line in read)
    assert len(again) == 6
    assert emulator.stats()["downloads"] == {ref: 2}


def test_results_are_read_from_the_results_url_the_batch_gives(clock, settings, monkeypatch):
    class Elsewhere(AnthropicEmulator):
        results_path = "/v1/elsewhere/<batch_id>/results.jsonl"

    with Elsewhere(per_request_ms=5, clock=clock) as emulator:
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        settings.PROVIDERS = {
            **settings.PROVIDERS,
            "anthropic": {**settings.PROVIDERS["anthropic"], "base_url": emulator.base_url},
        }
        provider = get_provider("anthropic")
        ref = provider.submit(requests=requests(2), intent_key="bd_elsewhere", metadata={})
        run_to_end(clock, provider, ref)

        assert len(list(provider.results(ref))) == 2


def test_results_before_the_batch_has_ended_are_a_transient_provider_error(emulator, provider):
    emulator.configure(per_request_ms=1000)
    ref = provider.submit(requests=requests(2), intent_key="bd_early", metadata={})

    with pytest.raises(ProviderError) as raised:
        list(provider.results(ref))

    assert raised.value.transient and "results_url" in str(raised.value)


def test_a_lost_create_answer_is_answer_lost_and_the_batch_is_a_candidate(clock, emulator, provider):
    emulator.configure(lose_create_responses=[1])
    sent_at = datetime.now(UTC)

    with pytest.raises(AnswerLost):
        provider.submit(requests=requests(3), intent_key="bd_lost", metadata={})

    candidates = provider.find_units(intent_key="bd_lost", sent_at=sent_at, request_count=3)
    assert len(candidates) == 1
    assert emulator.stats()["creates"] == 1
    # The ledger owns a candidate by the custom_ids of its results.
    run_to_end(clock, provider, candidates[0])
    assert {line.custom_id for line in provider.results(candidates[0])} == {"bd-0-1", "bd-1-1", "bd-2-1"}


def test_find_units_lists_candidates_by_window_and_request_count_oldest_first(
    emulator, provider, monkeypatch
):
    monkeypatch.setattr(adapter_module, "LISTING_PAGE", 2)  # so the listing takes several pages
    sent_at = datetime.now(UTC)
    first = provider.submit(requests=requests(2, prefix="a"), intent_key="k1", metadata={})
    provider.submit(requests=requests(3, prefix="b"), intent_key="k2", metadata={})
    second = provider.submit(requests=requests(2, prefix="c"), intent_key="k3", metadata={})
    provider.submit(requests=requests(1, prefix="d"), intent_key="k4", metadata={})
    provider.submit(requests=requests(1, prefix="e"), intent_key="k5", metadata={})

    assert provider.find_units(intent_key="k1", sent_at=sent_at, request_count=2) == [first, second]
    # Created up to a minute before our clock said we sent it (clock skew) still counts.
    assert provider.find_units(intent_key="k1", sent_at=sent_at + timedelta(seconds=50), request_count=2) == [
        first,
        second,
    ]
    assert (
        provider.find_units(intent_key="k1", sent_at=sent_at + timedelta(seconds=90), request_count=2) == []
    )
    assert (
        provider.find_units(intent_key="k1", sent_at=sent_at - timedelta(minutes=20), request_count=2) == []
    )
    assert provider.find_units(intent_key="k1", sent_at=sent_at, request_count=4) == []


def test_cancel_answers_canceling_and_unrun_requests_end_canceled(clock, emulator, provider):
    emulator.configure(per_request_ms=200)
    ref = provider.submit(requests=requests(10), intent_key="bd_cancel", metadata={})
    clock.advance(ms=250)  # one request has run

    said = provider.cancel(ref)
    status = run_to_end(clock, provider, ref)
    lines = by_id(provider.results(ref))

    assert said == "canceling"
    assert status.provider_status == "ended"
    canceled = [line for line in lines.values() if line.error_code == "canceled"]
    assert len(canceled) == 9  # nothing runs once the cancel is asked
    assert {(line.reason, line.transient) for line in canceled} == {(ReasonCode.MODEL_FAILED, False)}
    assert status.counts == UnitCounts(total=10, succeeded=10 - len(canceled), failed=len(canceled))


def test_cancelling_an_ended_batch_is_a_permanent_provider_error(clock, provider):
    ref = provider.submit(requests=requests(1), intent_key="bd_done", metadata={})
    run_to_end(clock, provider, ref)

    with pytest.raises(ProviderError) as raised:
        provider.cancel(ref)

    assert raised.value.status == 400 and not raised.value.transient


@pytest.mark.parametrize("path", ["POST /v1/messages/batches", "GET /v1/messages/batches/"])
def test_429_is_transient_and_carries_retry_after(emulator, provider, path):
    ref = provider.submit(requests=requests(1), intent_key="bd_429_setup", metadata={})
    emulator.configure(rate_limit_calls=1, rate_limit_path=path, retry_after=7)

    with pytest.raises(ProviderError) as raised:
        if path.startswith("POST"):
            provider.submit(requests=requests(1, prefix="x"), intent_key="bd_429", metadata={})
        else:
            provider.status(ref)

    assert not isinstance(raised.value, AnswerLost)  # an answer came: nothing was created
    assert (raised.value.status, raised.value.transient, raised.value.retry_after) == (429, True, 7)
    assert "rate_limit_error" in str(raised.value)


def test_529_overloaded_is_transient(emulator, provider):
    emulator.configure(server_errors=1, server_error_status=529, retry_after=3)

    with pytest.raises(ProviderError) as raised:
        provider.submit(requests=requests(1), intent_key="bd_529", metadata={})

    assert not isinstance(raised.value, AnswerLost)
    assert (raised.value.status, raised.value.transient) == (529, True)
    assert "overloaded_error" in str(raised.value)
    assert emulator.stats()["batches"] == 0


def test_a_refused_create_is_permanent(provider):
    bad = InferenceRequest("not a valid id!", "m", "s", "u", None, 10)

    with pytest.raises(ProviderError) as raised:
        provider.submit(requests=[bad], intent_key="bd_bad", metadata={})

    assert (raised.value.status, raised.value.transient) == (400, False)
    assert "custom_id" in str(raised.value)


def test_a_call_that_never_left_is_an_ordinary_error_not_answer_lost(settings, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    settings.PROVIDERS = {
        **settings.PROVIDERS,
        "anthropic": {**settings.PROVIDERS["anthropic"], "base_url": "http://127.0.0.1:9"},
    }

    with pytest.raises(ProviderError) as raised:
        get_provider("anthropic").submit(requests=requests(1), intent_key="bd_nowhere", metadata={})

    assert not isinstance(raised.value, AnswerLost) and raised.value.transient


def test_the_key_is_sent_as_x_api_key_with_the_version_and_never_shown(emulator, provider):
    seen = {}

    def echo(request: httpx.Request) -> httpx.Response:
        seen.update(request.headers)
        said = f"bad key {request.headers['x-api-key']} (x-api-key: {request.headers['x-api-key']})"
        return httpx.Response(
            401, json={"type": "error", "error": {"type": "authentication_error", "message": said}}
        )

    echoing = AnthropicBatchProvider(
        client=httpx.Client(
            base_url="https://api.anthropic.test",
            headers=provider.client.headers,
            transport=httpx.MockTransport(echo),
        )
    )
    with pytest.raises(ProviderError) as raised:
        echoing.status("msgbatch_1")
    envelope = {"type": "error", "error": {"type": "api_error", "message": f"upstream said {KEY}"}}
    line = parse_result_line(
        1, json.dumps({"custom_id": "a", "result": {"type": "errored", "error": envelope}}), secrets=[KEY]
    )

    assert (seen["x-api-key"], seen["anthropic-version"]) == (KEY, "2023-06-01")
    assert KEY not in str(raised.value) and "[redacted]" in str(raised.value)
    assert KEY not in line.error_message
    assert provider.client.headers["x-api-key"] == KEY  # read from the environment at build time
