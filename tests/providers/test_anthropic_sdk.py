"""The official `anthropic` SDK against the Anthropic emulator: proof that the emulator speaks
the real protocol (paths, batch objects, list pages, the results stream, errors)."""

import anthropic
import pytest

from ledger.emulators.anthropic import AnthropicEmulator
from ledger.emulators.clock import TestClock


def request(custom_id: str, **params) -> dict:
    return {
        "custom_id": custom_id,
        "params": {
            "model": "claude-sonnet-4-5",
            "max_tokens": 300,
            "system": "You write product descriptions.",
            "messages": [{"role": "user", "content": f"Title: Oak stool {custom_id}\n- wood: oak"}],
            **params,
        },
    }


@pytest.fixture
def clock():
    return TestClock()


@pytest.fixture
def emulator(clock):
    with AnthropicEmulator(per_request_ms=10, clock=clock) as emu:
        yield emu


@pytest.fixture
def client(emulator):
    sdk = anthropic.Anthropic(base_url=emulator.base_url, api_key="k", max_retries=0)
    yield sdk
    sdk.close()


def until_ended(clock, client, batch_id: str):
    """The batch once the emulator's clock has moved past every request it holds."""
    clock.advance(seconds=60)
    batch = client.messages.batches.retrieve(batch_id)
    assert batch.processing_status == "ended", batch
    return batch


def test_create_retrieve_list_and_read_results(clock, emulator, client):
    tool = {
        "name": "output",
        "input_schema": {"type": "object", "properties": {"headline": {"type": "string"}}},
    }
    created = client.messages.batches.create(
        requests=[
            request("bd-1-1"),
            request("bd-2-1"),
            request("bd-3-1", tools=[tool], tool_choice={"type": "tool", "name": "output"}),
        ]
    )
    batch = until_ended(clock, client, created.id)
    listed = [b.id for b in client.messages.batches.list(limit=10)]
    results = {r.custom_id: r.result for r in client.messages.batches.results(created.id)}

    assert (created.type, created.processing_status, created.request_counts.processing) == (
        "message_batch",
        "in_progress",
        3,
    )
    assert created.results_url is None and created.ended_at is None
    assert batch.request_counts.succeeded == 3 and batch.ended_at is not None
    assert batch.expires_at > batch.created_at
    assert listed == [created.id]
    assert set(results) == {"bd-1-1", "bd-2-1", "bd-3-1"}
    assert all(result.type == "succeeded" for result in results.values())
    assert results["bd-1-1"].message.content[0].type == "text"
    assert results["bd-1-1"].message.usage.input_tokens > 0
    tool_use = results["bd-3-1"].message.content[0]
    assert (tool_use.type, tool_use.name, set(tool_use.input)) == ("tool_use", "output", {"headline"})
    assert emulator.stats()["inferences"] == {"bd-1-1": 1, "bd-2-1": 1, "bd-3-1": 1}


def test_list_pages_through_every_batch_with_after_id(client):
    ids = [client.messages.batches.create(requests=[request(f"bd-{n}-1")]).id for n in range(5)]

    paged = [b.id for b in client.messages.batches.list(limit=2)]  # auto-pagination follows last_id

    assert paged == list(reversed(ids))


def test_cancel_and_the_canceled_results(clock, emulator, client):
    emulator.configure(per_request_ms=1000)
    created = client.messages.batches.create(requests=[request(f"bd-{n}-1") for n in range(4)])

    canceling = client.messages.batches.cancel(created.id)
    batch = until_ended(clock, client, created.id)
    results = list(client.messages.batches.results(created.id))

    assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at is not None
    assert batch.request_counts.canceled == 4
    assert {r.result.type for r in results} == {"canceled"}
    assert client.messages.batches.delete(created.id).type == "message_batch_deleted"


def test_errored_and_expired_results_read_as_the_sdks_types(clock, emulator, client):
    emulator.configure(fail_rate=1.0)
    failing = client.messages.batches.create(requests=[request("bd-1-1")])
    until_ended(clock, client, failing.id)
    emulator.configure(fail_rate=0.0, expire_rate=1.0)
    expiring = client.messages.batches.create(requests=[request("bd-2-1")])
    until_ended(clock, client, expiring.id)

    (errored,) = client.messages.batches.results(failing.id)
    (expired,) = client.messages.batches.results(expiring.id)

    assert errored.result.type == "errored"
    assert (errored.result.error.type, errored.result.error.error.type) == ("error", "api_error")
    assert expired.result.type == "expired"


def test_errors_become_the_sdks_exceptions(emulator, client):
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.batches.create(requests=[request("not valid!")])
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve("msgbatch_nope")
    emulator.configure(rate_limit_calls=1, retry_after=2)
    with pytest.raises(anthropic.RateLimitError) as limited:
        client.messages.batches.list()
    emulator.configure(server_errors=1, server_error_status=529)
    with pytest.raises(anthropic.InternalServerError) as overloaded:
        client.messages.batches.list()

    assert bad.value.body["error"]["type"] == "invalid_request_error"
    assert limited.value.response.headers["retry-after"] == "2"
    assert overloaded.value.status_code == 529
    assert overloaded.value.body["error"]["type"] == "overloaded_error"


def test_the_sdk_retries_a_529_by_itself(emulator):
    emulator.configure(server_errors=1, server_error_status=529, retry_after=0)
    retrying = anthropic.Anthropic(base_url=emulator.base_url, api_key="k", max_retries=1)

    page = retrying.messages.batches.list()

    assert page.data == [] and emulator.stats()["rejected_calls"] == 1
    retrying.close()


def test_every_answer_carries_a_request_id(clock, client):
    created = client.messages.batches.create(requests=[request("bd-1-1")])
    until_ended(clock, client, created.id)
    listed = client.messages.batches.with_raw_response.list()
    results = client.messages.batches.with_raw_response.results(created.id)
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.batches.retrieve("msgbatch_nope")

    request_ids = [created._request_id, listed.request_id, results.request_id, missing.value.request_id]
    assert all(rid and rid.startswith("req_") for rid in request_ids), request_ids
    assert len(set(request_ids)) == 4
    # An error's request id is the one its body names.
    assert missing.value.body["request_id"] == missing.value.request_id


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"], ids=repr)
def test_a_title_holding_a_line_break_other_than_newline_comes_back_in_its_result(clock, client, separator):
    sent = request("bd-1-1")
    sent["params"]["messages"][0]["content"] = f"Title: Oak{separator}stool\n- wood: oak"
    created = client.messages.batches.create(requests=[sent, request("bd-2-1")])
    until_ended(clock, client, created.id)

    results = {r.custom_id: r.result for r in client.messages.batches.results(created.id)}

    assert {custom_id: result.type for custom_id, result in results.items()} == {
        "bd-1-1": "succeeded",
        "bd-2-1": "succeeded",
    }
    assert f"Oak{separator}stool" in results["bd-1-1"].message.content[0].text
