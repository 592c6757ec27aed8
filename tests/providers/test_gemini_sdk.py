"""The official `google-genai` SDK, pointed at the Gemini emulator, creates an inline batch,
polls it, lists batches, reads the inlined responses and cancels one: the emulator speaks the
shapes the SDK sends and reads."""

import json
import time

import pytest
from google import genai
from google.genai import errors, types

from ledger.emulators.gemini import GeminiEmulator

SCHEMA = {
    "type": "object",
    "properties": {"headline": {"type": "string"}, "description": {"type": "string"}},
    "required": ["headline", "description"],
}
ENDED = {
    types.JobState.JOB_STATE_SUCCEEDED,
    types.JobState.JOB_STATE_FAILED,
    types.JobState.JOB_STATE_CANCELLED,
    types.JobState.JOB_STATE_EXPIRED,
}


@pytest.fixture
def emulator():
    with GeminiEmulator(per_request_ms=2, seed=11) as running:
        running.pending_ms = 10
        yield running


def client_for(emulator, **options) -> genai.Client:
    root = emulator.base_url.removesuffix("/v1beta")
    return genai.Client(
        api_key="sdk-test-key", http_options=types.HttpOptions(base_url=root, api_version="v1beta", **options)
    )


def inline(key: str, title: str) -> dict:
    return {
        "contents": [{"role": "user", "parts": [{"text": f"Write a description.\nTitle: {title}"}]}],
        "metadata": {"key": key},
        "config": {
            "system_instruction": "You write product descriptions.",
            "max_output_tokens": 300,
            "response_mime_type": "application/json",
            "response_json_schema": SCHEMA,
        },
    }


def wait(client: genai.Client, name: str) -> types.BatchJob:
    for _ in range(300):
        job = client.batches.get(name=name)
        if job.state in ENDED:
            return job
        time.sleep(0.02)
    raise AssertionError("the batch never ended")


def test_the_sdk_creates_polls_lists_and_reads_inline_results(emulator):
    client = client_for(emulator)
    sent = {f"bd-{n}-1": f"Oak chair {n}" for n in range(4)}

    job = client.batches.create(
        model="gemini-2.5-flash",
        src=[inline(key, title) for key, title in sent.items()],
        config={"display_name": "bd_intent_sdk"},
    )
    assert job.name.startswith("batches/")
    assert job.display_name == "bd_intent_sdk"
    assert job.state == types.JobState.JOB_STATE_PENDING
    assert job.model == "models/gemini-2.5-flash"

    done = wait(client, job.name)

    assert done.state == types.JobState.JOB_STATE_SUCCEEDED
    assert done.end_time is not None and done.create_time <= done.end_time
    responses = done.dest.inlined_responses
    assert sorted(r.metadata["key"] for r in responses) == sorted(sent)
    for answer in responses:
        assert answer.error is None
        assert set(json.loads(answer.response.text)) == {"headline", "description"}
        usage = answer.response.usage_metadata
        assert usage.prompt_token_count > 0 and usage.candidates_token_count > 0
        assert usage.total_token_count == usage.prompt_token_count + usage.candidates_token_count
    assert emulator.stats()["inferences"] == dict.fromkeys(sent, 1)


def test_the_sdk_lists_batches_page_by_page(emulator):
    client = client_for(emulator)
    names = [
        client.batches.create(
            model="gemini-2.5-flash", src=[inline(f"k{n}", "Spoon")], config={"display_name": f"bd_list_{n}"}
        ).name
        for n in range(5)
    ]

    pager = client.batches.list(config={"page_size": 2})
    first_page = list(pager.page)
    listed = list(pager)

    assert len(first_page) == 2
    assert sorted(job.name for job in listed) == sorted(names)
    assert {job.display_name for job in listed} == {f"bd_list_{n}" for n in range(5)}


def test_the_sdk_cancels_a_batch(emulator):
    emulator.configure(per_request_ms=50)
    client = client_for(emulator)
    job = client.batches.create(
        model="gemini-2.5-flash",
        src=[inline(f"c{n}", "Table") for n in range(40)],
        config={"display_name": "bd_cancel"},
    )
    time.sleep(0.15)

    client.batches.cancel(name=job.name)
    cancelled = client.batches.get(name=job.name)

    assert cancelled.state == types.JobState.JOB_STATE_CANCELLED
    kept = cancelled.dest.inlined_responses if cancelled.dest else []
    assert len(kept) < 40
    with pytest.raises(errors.ClientError) as again:
        client.batches.cancel(name=job.name)
    assert again.value.code == 400 and again.value.status == "FAILED_PRECONDITION"


def test_the_sdk_reads_per_request_errors(emulator):
    emulator.configure(fail_rate=1.0)
    client = client_for(emulator)
    job = client.batches.create(
        model="gemini-2.5-flash", src=[inline("f1", "Lamp")], config={"display_name": "bd_f"}
    )

    done = wait(client, job.name)

    (answer,) = done.dest.inlined_responses
    assert answer.response is None
    assert (answer.error.code, answer.metadata) == (13, {"key": "f1"})


def test_the_sdk_understands_googles_error_envelope_and_retries_a_429(emulator):
    client = client_for(emulator)
    with pytest.raises(errors.ClientError) as missing:
        client.batches.get(name="batches/nope")
    assert (missing.value.code, missing.value.status) == (404, "NOT_FOUND")

    emulator.configure(rate_limit_calls=2, retry_after=0)
    patient = client_for(
        emulator, retry_options=types.HttpRetryOptions(attempts=4, initial_delay=0.01, max_delay=0.05)
    )
    job = patient.batches.create(
        model="gemini-2.5-flash", src=[inline("r1", "Cup")], config={"display_name": "bd_r"}
    )

    assert job.name.startswith("batches/")
    stats = emulator.stats()
    assert stats["rejected_calls"] == 2 and stats["creates"] == 3 and stats["batches"] == 1
