"""The official `google-genai` SDK, pointed at the Gemini emulator, creates an inline batch,
polls it, lists batches, reads the inlined responses and cancels one; it uploads a JSONL file,
creates a batch from it and downloads its responses file: the emulator speaks the shapes the SDK
sends and reads."""

import io
import json

import pytest
from google import genai
from google.genai import errors, types

from ledger.emulators.clock import TestClock
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
def clock():
    return TestClock()


@pytest.fixture
def emulator(clock):
    with GeminiEmulator(per_request_ms=2, pending_ms=10, seed=11, clock=clock) as running:
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


def wait(clock, client: genai.Client, name: str) -> types.BatchJob:
    """The batch once the emulator's clock has moved past every request it holds."""
    clock.advance(seconds=60)
    job = client.batches.get(name=name)
    assert job.state in ENDED, job.state
    return job


def test_the_sdk_creates_polls_lists_and_reads_inline_results(clock, emulator):
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

    done = wait(clock, client, job.name)

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


def test_the_sdk_cancels_a_batch(clock, emulator):
    emulator.configure(per_request_ms=50)
    client = client_for(emulator)
    job = client.batches.create(
        model="gemini-2.5-flash",
        src=[inline(f"c{n}", "Table") for n in range(40)],
        config={"display_name": "bd_cancel"},
    )
    clock.advance(ms=150)  # 10 ms pending, then two requests of 50 ms

    client.batches.cancel(name=job.name)
    cancelled = client.batches.get(name=job.name)

    assert cancelled.state == types.JobState.JOB_STATE_CANCELLED
    kept = cancelled.dest.inlined_responses if cancelled.dest else []
    assert sorted(response.metadata["key"] for response in kept) == ["c0", "c1"]
    with pytest.raises(errors.ClientError) as again:
        client.batches.cancel(name=job.name)
    assert again.value.code == 400 and again.value.status == "FAILED_PRECONDITION"


def test_the_sdk_reads_per_request_errors(clock, emulator):
    emulator.configure(fail_rate=1.0)
    client = client_for(emulator)
    job = client.batches.create(
        model="gemini-2.5-flash", src=[inline("f1", "Lamp")], config={"display_name": "bd_f"}
    )

    done = wait(clock, client, job.name)

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


def test_the_sdk_uploads_a_file_creates_a_batch_from_it_and_downloads_its_responses(
    clock, emulator, tmp_path
):
    client = client_for(emulator)
    sent = {f"bd-{n}-1": f"Walnut shelf {n}" for n in range(5)}
    path = tmp_path / "requests.jsonl"
    with path.open("w") as out:
        for key, title in sent.items():
            request = {
                "contents": [{"role": "user", "parts": [{"text": f"Write a description.\nTitle: {title}"}]}],
                "systemInstruction": {"parts": [{"text": "You write product descriptions."}]},
                "generationConfig": {
                    "maxOutputTokens": 300,
                    "responseMimeType": "application/json",
                    "responseJsonSchema": SCHEMA,
                },
            }
            out.write(json.dumps({"key": key, "request": request}) + "\n")

    uploaded = client.files.upload(
        file=str(path), config=types.UploadFileConfig(display_name="bd_file_sdk", mime_type="jsonl")
    )
    assert uploaded.name.startswith("files/") and uploaded.display_name == "bd_file_sdk"
    assert uploaded.size_bytes == path.stat().st_size
    assert uploaded.state == types.FileState.ACTIVE and uploaded.source == types.FileSource.UPLOADED

    job = client.batches.create(
        model="gemini-2.5-flash", src=uploaded.name, config={"display_name": "bd_file_sdk"}
    )
    assert job.name.startswith("batches/") and job.display_name == "bd_file_sdk"
    done = wait(clock, client, job.name)

    assert done.state == types.JobState.JOB_STATE_SUCCEEDED
    assert done.dest.inlined_responses is None and done.dest.file_name.startswith("files/batch-")
    content = client.files.download(file=done.dest.file_name)
    lines = [json.loads(text) for text in content.decode().splitlines()]
    assert sorted(line["key"] for line in lines) == sorted(sent)
    for line in lines:
        answer = types.GenerateContentResponse.model_validate(line["response"])
        assert set(json.loads(answer.text)) == {"headline", "description"}
        assert answer.usage_metadata.prompt_token_count > 0
    # The responses file is generated, so the SDK may download it by its File object too.
    generated = client.files.get(name=done.dest.file_name)
    assert generated.source == types.FileSource.GENERATED and generated.download_uri
    streamed = io.BytesIO()
    client.files.download(file=generated, destination=streamed)
    assert streamed.getvalue() == content
    assert emulator.stats()["inferences"] == dict.fromkeys(sent, 1)


def test_the_sdk_uploads_in_chunks_across_its_chunk_size(clock, emulator, monkeypatch):
    """The SDK sends files in 8 MB chunks (`upload` then `upload, finalize`); a small chunk size
    shows the emulator joins them at their offsets."""
    from google.genai import _api_client

    monkeypatch.setattr(_api_client, "CHUNK_SIZE", 100)
    client = client_for(emulator)
    content = b"".join(
        json.dumps(
            {"key": f"c{n}", "request": {"contents": [{"parts": [{"text": f"Title: Cup {n}"}]}]}}
        ).encode()
        + b"\n"
        for n in range(6)
    )

    uploaded = client.files.upload(file=io.BytesIO(content), config={"mime_type": "application/jsonl"})
    done = wait(
        clock,
        client,
        client.batches.create(
            model="gemini-2.5-flash", src=uploaded.name, config={"display_name": "bd_chunks"}
        ).name,
    )

    assert uploaded.size_bytes == len(content) > 300
    assert done.state == types.JobState.JOB_STATE_SUCCEEDED
    assert sorted(
        json.loads(text)["key"]
        for text in client.files.download(file=done.dest.file_name).decode().splitlines()
    ) == [f"c{n}" for n in range(6)]


def test_inline_requests_without_metadata_are_answered_in_their_order(clock, emulator):
    client = client_for(emulator)
    titles = [f"Birch stool {n}" for n in range(4)]
    keyless = []
    for title in titles:
        request = inline("unused", title)
        del request["metadata"]
        keyless.append(request)

    done = wait(
        clock,
        client,
        client.batches.create(model="gemini-2.5-flash", src=keyless, config={"display_name": "bd_k"}).name,
    )

    assert done.state == types.JobState.JOB_STATE_SUCCEEDED
    responses = done.dest.inlined_responses
    assert [answer.error for answer in responses] == [None] * 4
    assert [answer.metadata for answer in responses] == [None] * 4
    assert all(title in answer.response.text for title, answer in zip(titles, responses, strict=True))


def upload_jsonl(client: genai.Client, lines: list[dict]) -> types.File:
    content = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()
    return client.files.upload(file=io.BytesIO(content), config={"mime_type": "application/jsonl"})


def test_the_sdk_lists_files_page_by_page(emulator):
    client = client_for(emulator)
    assert list(client.files.list()) == []
    uploaded = [
        upload_jsonl(
            client, [{"key": f"l{n}", "request": {"contents": [{"parts": [{"text": "Title: Mug"}]}]}}]
        )
        for n in range(12)
    ]

    pager = client.files.list(config={"page_size": 5})
    first_page = list(pager.page)
    listed = [stored.name for stored in pager]

    assert len(first_page) == 5
    assert listed == [stored.name for stored in reversed(uploaded)]
    assert len(client.files.list().page) == 10  # the default page, as Google's


def test_a_page_size_of_0_is_the_default_page(emulator):
    client = client_for(emulator)
    for n in range(12):
        client.batches.create(
            model="gemini-2.5-flash", src=[inline(f"p{n}", "Bowl")], config={"display_name": f"bd_p{n}"}
        )
        upload_jsonl(
            client, [{"key": f"f{n}", "request": {"contents": [{"parts": [{"text": "Title: Bowl"}]}]}}]
        )

    assert len(client.batches.list(config={"page_size": 0}).page) == 12
    assert len(client.files.list(config={"page_size": 0}).page) == 10
    with pytest.raises(errors.ClientError) as negative:
        client.batches.list(config={"page_size": -1})
    assert (negative.value.code, negative.value.status) == (400, "INVALID_ARGUMENT")


@pytest.mark.parametrize(
    "separator", ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e"], ids=repr
)
def test_a_file_whose_title_holds_a_line_break_other_than_newline_runs_like_any_other(
    clock, emulator, separator
):
    client = client_for(emulator)

    def line(key: str, title: str) -> dict:
        return {
            "key": key,
            "request": {"contents": [{"parts": [{"text": f"Write a description.\nTitle: {title}"}]}]},
        }

    uploaded = upload_jsonl(client, [line("s1", f"Oak{separator}stool"), line("s2", "Elm stool")])
    done = wait(
        clock,
        client,
        client.batches.create(
            model="gemini-2.5-flash", src=uploaded.name, config={"display_name": "bd_s"}
        ).name,
    )

    assert done.state == types.JobState.JOB_STATE_SUCCEEDED
    # Split as the adapter does: at newlines only.
    content = client.files.download(file=done.dest.file_name).decode()
    lines = [json.loads(text) for text in content.split("\n") if text]
    assert sorted(line["key"] for line in lines) == ["s1", "s2"]
    assert all("response" in line for line in lines)
