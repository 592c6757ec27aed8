"""The official `openai` SDK against the OpenAI Files + Batch emulator, for what the SDK found
missing (issue 17): listing and deleting files, a completion window other than 24h refused, an
`x-request-id` on every answer, an input file split at newlines only, and strict Structured
Outputs' schema subset refused as OpenAI refuses it."""

import json

import openai
import pytest

from ledger.emulators.clock import TestClock
from ledger.emulators.openai import Emulator

ENDPOINT = "/v1/chat/completions"
ENDED = {"completed", "failed", "expired", "cancelled"}
# The characters str.splitlines() ends a line at besides \n and \r: inside a JSON string only the
# first three may stand unescaped, the others are control characters JSON writes as \u escapes.
LINE_BREAKS_BUT_NOT_NEWLINE = ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e"]
CLOSED_SCHEMA = {
    "type": "object",
    "properties": {"headline": {"type": "string"}, "description": {"type": "string"}},
    "required": ["headline", "description"],
    "additionalProperties": False,
}


@pytest.fixture
def clock():
    return TestClock()


@pytest.fixture
def emulator(clock):
    with Emulator(per_request_ms=2, validating_ms=20, finalizing_ms=5, seed=3, clock=clock) as running:
        yield running


@pytest.fixture
def client(emulator):
    with openai.OpenAI(base_url=emulator.base_url, api_key="sk-test", max_retries=0) as sdk:
        yield sdk


def request_line(custom_id: str, title: str = "Oak board", **body: object) -> dict:
    prompt = f"Write a description.\nTitle: {title}\nFacts:\n- material: oak"
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": ENDPOINT,
        "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": prompt}], **body},
    }


def jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()


def run_batch(clock: TestClock, client: openai.OpenAI, lines: list[dict]):
    uploaded = client.files.create(file=("batch.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=ENDPOINT, completion_window="24h")
    for _ in range(500):
        if batch.status in ENDED:
            return batch
        clock.advance(ms=10)
        batch = client.batches.retrieve(batch.id)
    raise AssertionError(f"batch {batch.id} never ended")


def file_lines(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    # Split as the adapters do: at newlines only.
    return [json.loads(text) for text in client.files.content(file_id).text.split("\n") if text]


def test_files_are_listed_newest_first_page_by_page_and_by_purpose(clock, client):
    uploaded = [
        client.files.create(file=(f"f{n}.jsonl", jsonl([request_line(f"f{n}")])), purpose="batch")
        for n in range(5)
    ]
    batch = run_batch(clock, client, [request_line("x")])
    newest_first = [batch.output_file_id, batch.input_file_id, *[f.id for f in reversed(uploaded)]]

    listed = client.files.list(limit=2)  # iterating follows `after` across pages
    assert [f.id for f in listed.data] == newest_first[:2] and listed.has_more
    assert [f.id for f in listed] == newest_first

    assert [f.id for f in client.files.list(order="asc", limit=3)] == list(reversed(newest_first))
    assert [f.id for f in client.files.list(purpose="batch_output")] == [batch.output_file_id]
    after_third = client.files.list(after=newest_first[2], limit=10)
    assert [f.id for f in after_third.data] == newest_first[3:] and not after_third.has_more


def test_a_bad_listing_is_refused_with_the_parameter_it_names(client):
    with pytest.raises(openai.BadRequestError) as too_many:
        client.files.list(limit=10_001)
    assert too_many.value.param == "limit"
    with pytest.raises(openai.BadRequestError) as sideways:
        client.files.list(extra_query={"order": "sideways"})
    assert sideways.value.param == "order"


def test_a_deleted_file_answers_the_deleted_object_and_is_gone(client):
    uploaded = client.files.create(file=("batch.jsonl", jsonl([request_line("d")])), purpose="batch")
    kept = client.files.create(file=("kept.jsonl", jsonl([request_line("k")])), purpose="batch")

    deleted = client.files.delete(uploaded.id)

    assert (deleted.id, deleted.object, deleted.deleted) == (uploaded.id, "file", True)
    assert [f.id for f in client.files.list()] == [kept.id]
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        client.files.delete(uploaded.id)


def test_a_completion_window_other_than_24h_is_refused_when_the_batch_is_created(emulator, client):
    uploaded = client.files.create(file=("batch.jsonl", jsonl([request_line("w")])), purpose="batch")

    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=uploaded.id, endpoint=ENDPOINT, completion_window="48h")

    assert refused.value.param == "completion_window"
    assert refused.value.body["type"] == "invalid_request_error"
    assert emulator.stats()["batches"] == 0


def test_every_answer_carries_an_x_request_id(client):
    uploaded = client.files.create(file=("batch.jsonl", jsonl([request_line("r")])), purpose="batch")
    raw = client.files.with_raw_response.content(uploaded.id)

    with pytest.raises(openai.NotFoundError) as missing:
        client.batches.retrieve("batch_nope")

    request_ids = [uploaded._request_id, raw.request_id, missing.value.request_id]
    assert all(rid and rid.startswith("req_") for rid in request_ids), request_ids
    assert len(set(request_ids)) == 3


@pytest.mark.parametrize("separator", LINE_BREAKS_BUT_NOT_NEWLINE, ids=repr)
def test_a_title_holding_a_line_break_other_than_newline_runs_like_any_other(clock, client, separator):
    title = f"Oak board{separator}large"
    batch = run_batch(clock, client, [request_line("sep-1", title), request_line("sep-2")])

    assert (batch.status, batch.errors, batch.request_counts.completed) == ("completed", None, 2)
    output = file_lines(client, batch.output_file_id)
    assert {line["custom_id"] for line in output} == {"sep-1", "sep-2"}


def test_a_strict_schema_outside_openais_subset_fails_its_line_with_openais_error(clock, emulator, client):
    emulator.configure(strict_schemas=True)
    lengths = {
        **CLOSED_SCHEMA,
        "properties": {"headline": {"type": "string", "minLength": 3}, "description": {"type": "string"}},
    }

    def strict(schema: dict) -> dict:
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}

    batch = run_batch(
        clock,
        client,
        [
            request_line("refused", response_format=strict(lengths)),
            request_line("accepted", response_format=strict(CLOSED_SCHEMA)),
            request_line(
                "not-strict",
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "output", "schema": lengths, "strict": False},
                },
            ),
        ],
    )

    assert batch.status == "completed" and batch.request_counts.failed == 1
    assert {line["custom_id"] for line in file_lines(client, batch.output_file_id)} == {
        "accepted",
        "not-strict",
    }
    (failed,) = file_lines(client, batch.error_file_id)
    assert failed["custom_id"] == "refused" and failed["error"] is None
    assert failed["response"]["status_code"] == 400
    assert failed["response"]["body"] == {
        "error": {
            "message": "Invalid schema for response_format 'output': In context=('properties', 'headline'), "
            "'minLength' is not permitted.",
            "type": "invalid_request_error",
            "param": "response_format",
            "code": None,
        }
    }
    assert set(emulator.stats()["inferences"]) == {"accepted", "not-strict"}
