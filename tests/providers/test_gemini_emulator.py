"""The Gemini Batch Mode emulator over raw HTTP: its shapes, its clock and each of its knobs."""

import json
from dataclasses import asdict

import httpx
import pytest

from ledger.emulators.clock import TestClock
from ledger.emulators.gemini import GeminiEmulator
from ledger.emulators.knobs import FaultKnobs
from ledger.emulators.server import ApiError

HEADERS = {"x-goog-api-key": "test-key"}


def entry(key, text: str = "Write a description.\nTitle: Ash bowl") -> dict:
    return {
        "request": {
            "contents": [{"role": "user", "parts": [{"text": text}]}],
            "generationConfig": {"maxOutputTokens": 200},
        },
        "metadata": {"key": key},
    }


def body(keys, display_name: str = "bd_intent") -> dict:
    return {
        "batch": {
            "displayName": display_name,
            "inputConfig": {"requests": {"requests": [entry(key) for key in keys]}},
        }
    }


@pytest.fixture
def clock():
    return TestClock()


@pytest.fixture
def emulator(clock):
    with GeminiEmulator(per_request_ms=1, pending_ms=10, seed=7, clock=clock) as running:
        yield running


@pytest.fixture
def http(emulator):
    with httpx.Client(base_url=emulator.base_url, headers=HEADERS, timeout=10) as client:
        yield client


def create(http, keys, display_name: str = "bd_intent") -> dict:
    response = http.post("/models/gemini-2.5-flash:batchGenerateContent", json=body(keys, display_name))
    assert response.status_code == 200, response.text
    return response.json()


def ended(clock, http, name: str) -> dict:
    """The batch once the emulator's clock has moved past every request it holds."""
    clock.advance(seconds=60)
    operation = http.get(f"/{name}").json()
    assert operation.get("done"), operation
    return operation


def keys_of(operation: dict) -> list:
    return [
        (e.get("metadata") or {}).get("key")
        for e in operation["response"]["inlinedResponses"]["inlinedResponses"]
    ]


def test_a_batch_moves_from_pending_through_running_to_succeeded(clock, emulator, http):
    emulator.configure(per_request_ms=150)
    created = create(http, ["a", "b", "c"])
    metadata = created["metadata"]
    assert created["name"].startswith("batches/") and "done" not in created
    assert metadata["state"] == "BATCH_STATE_PENDING"
    assert metadata["batchStats"] == {"requestCount": "3", "pendingRequestCount": "3"}
    assert metadata["model"] == "models/gemini-2.5-flash" and metadata["displayName"] == "bd_intent"
    assert metadata["createTime"].endswith("Z")

    clock.advance(ms=50)
    running = http.get(f"/{created['name']}").json()["metadata"]
    done = ended(clock, http, created["name"])

    assert running["state"] == "BATCH_STATE_RUNNING"
    assert done["metadata"]["state"] == "BATCH_STATE_SUCCEEDED"
    assert done["metadata"]["batchStats"] == {"requestCount": "3", "successfulRequestCount": "3"}
    assert "endTime" in done["metadata"]
    # Inline results both where the REST guide reads them and where the SDK does.
    assert done["response"]["inlinedResponses"] == done["metadata"]["output"]["inlinedResponses"]
    answer = done["response"]["inlinedResponses"]["inlinedResponses"][0]
    assert answer["response"]["candidates"][0]["content"]["role"] == "model"
    assert set(answer["response"]["usageMetadata"]) == {
        "promptTokenCount",
        "candidatesTokenCount",
        "totalTokenCount",
    }


def test_snake_case_bodies_are_read_too(clock, http):
    snake = {
        "batch": {
            "display_name": "bd_snake",
            "input_config": {"requests": {"requests": [entry("s1")]}},
        }
    }
    created = http.post("/models/gemini-2.5-flash:batchGenerateContent", json=snake).json()
    assert created["metadata"]["displayName"] == "bd_snake"
    assert keys_of(ended(clock, http, created["name"])) == ["s1"]


def test_a_json_schema_shapes_the_answer(clock, http):
    request = entry("j1")
    request["request"]["generationConfig"].update(
        responseMimeType="application/json",
        responseJsonSchema={
            "type": "object",
            "properties": {"headline": {"type": "string"}},
            "required": ["headline"],
        },
    )
    payload = {"batch": {"displayName": "bd_j", "inputConfig": {"requests": {"requests": [request]}}}}
    created = http.post("/models/gemini-2.5-flash:batchGenerateContent", json=payload).json()
    text = ended(clock, http, created["name"])["response"]["inlinedResponses"]["inlinedResponses"][0][
        "response"
    ]
    assert text["candidates"][0]["content"]["parts"][0]["text"].startswith('{"headline": ')


@pytest.mark.parametrize(
    "payload, words",
    [
        ({}, "'batch' must be an object"),
        ({"batch": {"inputConfig": {"requests": {"requests": [entry("a")]}}}}, "display_name is required"),
        (
            {"batch": {"displayName": "x", "inputConfig": {"requests": {"requests": []}}}},
            "requests are required",
        ),
        (
            {"batch": {"displayName": "x", "inputConfig": {"requests": {"requests": [{"metadata": {}}]}}}},
            "request",
        ),
    ],
)
def test_a_bad_create_is_400_in_googles_envelope_and_creates_nothing(emulator, http, payload, words):
    response = http.post("/models/gemini-2.5-flash:batchGenerateContent", json=payload)
    error = response.json()["error"]
    assert response.status_code == 400
    assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT") and words in error["message"]
    assert emulator.stats()["batches"] == 0


def test_more_than_20_mb_inline_is_refused(emulator, http):
    big = body(["big"])
    big["batch"]["inputConfig"]["requests"]["requests"][0]["request"]["contents"][0]["parts"][0]["text"] = (
        "x" * (21 * 1024 * 1024)
    )
    response = http.post("/models/gemini-2.5-flash:batchGenerateContent", json=big)
    assert response.status_code == 400 and "exceeds" in response.json()["error"]["message"]
    assert emulator.stats()["batches"] == 0


def test_repeated_keys_fail_the_whole_batch_without_results(clock, http):
    created = create(http, ["a", "b", "a"])
    done = ended(clock, http, created["name"])
    assert done["metadata"]["state"] == "BATCH_STATE_FAILED"
    assert done["error"]["code"] == 3 and "a" in done["error"]["message"]
    assert "response" not in done and "output" not in done["metadata"]


def test_the_key_may_come_in_the_header_or_the_query_and_nothing_without_it(emulator):
    root = emulator.base_url
    missing = httpx.get(f"{root}/batches")
    by_query = httpx.get(f"{root}/batches", params={"key": "k"})
    error = missing.json()["error"]
    assert (missing.status_code, error["code"], error["status"]) == (403, 403, "PERMISSION_DENIED")
    assert by_query.status_code == 200 and by_query.json() == {"operations": []}


def test_listing_pages_with_page_tokens_newest_first(http):
    names = [create(http, [f"k{n}"], f"bd_{n}")["name"] for n in range(5)]
    first = http.get("/batches", params={"pageSize": 2}).json()
    second = http.get("/batches", params={"pageSize": 2, "pageToken": first["nextPageToken"]}).json()
    third = http.get("/batches", params={"pageSize": 2, "pageToken": second["nextPageToken"]}).json()
    listed = [op["name"] for page in (first, second, third) for op in page["operations"]]
    assert listed == list(reversed(names))
    assert "nextPageToken" not in third
    bad = http.get("/batches", params={"pageToken": "!!"})
    assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_cancel_keeps_what_ran_and_a_second_cancel_is_a_failed_precondition(clock, emulator, http):
    emulator.configure(per_request_ms=30)
    created = create(http, [f"c{n}" for n in range(30)])
    clock.advance(ms=120)  # 10 ms pending, then three requests of 30 ms

    cancelled = http.post(f"/{created['name']}:cancel")
    after = http.get(f"/{created['name']}").json()
    again = http.post(f"/{created['name']}:cancel")

    assert cancelled.status_code == 200 and cancelled.json() == {}
    assert after["metadata"]["state"] == "BATCH_STATE_CANCELLED" and after["done"]
    kept = keys_of(after)
    assert sorted(kept) == ["c0", "c1", "c2"]
    assert emulator.stats()["inferences"] == dict.fromkeys(kept, 1)
    assert again.status_code == 400 and again.json()["error"]["status"] == "FAILED_PRECONDITION"


def test_delete_removes_a_batch_and_unknown_batches_are_404(emulator, http):
    created = create(http, ["d"], "bd_deleted")
    assert http.delete(f"/{created['name']}").json() == {}
    assert http.get("/batches").json() == {"operations": []}
    missing = http.get(f"/{created['name']}")
    assert missing.status_code == 404 and missing.json()["error"]["status"] == "NOT_FOUND"
    # The evidence keeps what was created.
    assert emulator.stats()["batches_by_intent"] == {"bd_deleted": 1}


def test_fail_rate_answers_some_requests_with_an_internal_error_seeded(clock, emulator, http):
    emulator.configure(fail_rate=0.5)
    keys = [f"f{n}" for n in range(40)]
    done = ended(clock, http, create(http, keys)["name"])
    errors = {
        e["metadata"]["key"]: e["error"]
        for e in done["response"]["inlinedResponses"]["inlinedResponses"]
        if "error" in e
    }
    stats = done["metadata"]["batchStats"]

    assert 10 < len(errors) < 30
    assert all(error == {"code": 13, "message": "Internal error encountered."} for error in errors.values())
    assert stats == {
        "requestCount": "40",
        "successfulRequestCount": str(40 - len(errors)),
        "failedRequestCount": str(len(errors)),
    }
    assert set(emulator.stats()["inferences"]) == set(keys) - set(errors)
    # The same seed rolls the same dice.
    twin_clock = TestClock()
    with GeminiEmulator(per_request_ms=1, pending_ms=10, seed=7, fail_rate=0.5, clock=twin_clock) as twin:
        with httpx.Client(base_url=twin.base_url, headers=HEADERS) as twin_http:
            again = ended(twin_clock, twin_http, create(twin_http, keys)["name"])
    assert {
        e["metadata"]["key"]
        for e in again["response"]["inlinedResponses"]["inlinedResponses"]
        if "error" in e
    } == set(errors)


def test_an_empty_prompt_is_invalid_argument_for_that_request_only(clock, http):
    payload = body(["ok"])
    payload["batch"]["inputConfig"]["requests"]["requests"].append(entry("empty", text=""))
    done = ended(clock, http, http.post("/models/m:batchGenerateContent", json=payload).json()["name"])
    answers = {e["metadata"]["key"]: e for e in done["response"]["inlinedResponses"]["inlinedResponses"]}
    assert answers["empty"]["error"]["code"] == 3 and "response" in answers["ok"]


def test_expire_rate_expires_whole_batches_with_no_results(clock, emulator, http):
    emulator.configure(expire_rate=1.0)
    done = ended(clock, http, create(http, ["e1", "e2"])["name"])
    assert done["metadata"]["state"] == "BATCH_STATE_EXPIRED"
    assert "response" not in done and "output" not in done["metadata"]
    assert done["metadata"]["batchStats"] == {"requestCount": "2"}
    assert emulator.stats()["inferences"] == {}


def test_expire_after_ms_expires_a_batch_part_way_and_drops_what_ran(clock, emulator, http):
    emulator.configure(per_request_ms=20, expire_after_ms=400)
    created = create(http, [f"x{n}" for n in range(30)])
    clock.advance(ms=100)  # 10 ms pending, then four requests of 20 ms
    running = http.get(f"/{created['name']}").json()["metadata"]
    done = ended(clock, http, created["name"])

    assert (
        running["state"] == "BATCH_STATE_RUNNING" and running["batchStats"]["successfulRequestCount"] == "4"
    )
    assert done["metadata"]["state"] == "BATCH_STATE_EXPIRED"
    assert "response" not in done
    assert emulator.stats()["inferences"] == {}


def test_lose_create_responses_drops_the_answer_but_keeps_the_batch(emulator, http):
    emulator.configure(lose_create_responses=[2])
    create(http, ["l1"], "bd_first")
    with pytest.raises(httpx.TransportError):
        http.post("/models/gemini-2.5-flash:batchGenerateContent", json=body(["l2"], "bd_lost"))
    listed = http.get("/batches").json()["operations"]
    assert {op["metadata"]["displayName"] for op in listed} == {"bd_first", "bd_lost"}
    assert emulator.stats()["batches_by_intent"] == {"bd_first": 1, "bd_lost": 1}
    assert emulator.stats()["creates"] == 2


def test_a_429_storm_carries_retry_after_and_retry_info(emulator, http):
    emulator.configure(rate_limit_calls=2, retry_after=12, rate_limit_path="POST /v1beta/models")
    first = http.post("/models/m:batchGenerateContent", json=body(["r"]))
    second = http.post("/models/m:batchGenerateContent", json=body(["r"]))
    listing = http.get("/batches")
    third = http.post("/models/m:batchGenerateContent", json=body(["r"]))

    error = first.json()["error"]
    assert (first.status_code, second.status_code, listing.status_code, third.status_code) == (
        429,
        429,
        200,
        200,
    )
    assert first.headers["retry-after"] == "12"
    assert (error["code"], error["status"]) == (429, "RESOURCE_EXHAUSTED")
    assert error["details"] == [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "12s"}]
    assert emulator.stats()["rejected_calls"] == 2 and emulator.stats()["batches"] == 1


@pytest.mark.parametrize(
    "status, name", [(500, "INTERNAL"), (503, "UNAVAILABLE"), (504, "DEADLINE_EXCEEDED")]
)
def test_a_server_error_storm_in_googles_words(emulator, http, status, name):
    emulator.configure(server_errors=1, server_error_status=status)
    refused = http.get("/batches")
    assert refused.status_code == status
    assert refused.json()["error"] == {
        "code": status,
        "message": "The server had an error while processing your request.",
        "status": name,
    }
    assert http.get("/batches").status_code == 200


def test_duplicate_lines_repeat_successful_responses(clock, emulator, http):
    emulator.configure(duplicate_lines=1.0, fail_rate=0.3)
    done = ended(clock, http, create(http, [f"d{n}" for n in range(10)])["name"])
    entries = done["response"]["inlinedResponses"]["inlinedResponses"]
    succeeded = {e["metadata"]["key"] for e in entries if "response" in e}
    keys = keys_of(done)
    assert 0 < len(succeeded) < 10  # some of each, so neither check below holds for want of keys
    assert all(keys.count(key) == 2 for key in succeeded)
    assert all(keys.count(key) == 1 for key in set(keys) - succeeded)
    # Repeated in the answer, generated (paid for) once.
    assert emulator.stats()["inferences"] == dict.fromkeys(succeeded, 1)


def test_unknown_and_malformed_lines_are_mixed_in(clock, emulator, http):
    emulator.configure(unknown_lines=2, malformed_lines=3)
    done = ended(clock, http, create(http, ["u1", "u2"])["name"])
    keys = keys_of(done)
    assert sorted(k for k in keys if isinstance(k, str)) == ["u1", "u2", "unknown-1", "unknown-2"]
    assert len([k for k in keys if not isinstance(k, str)]) == 3
    assert set(emulator.stats()["inferences"]) == {"u1", "u2"}


def test_count_mismatch_claims_one_success_more_than_the_results_hold(clock, emulator, http):
    emulator.configure(count_mismatch=True)
    done = ended(clock, http, create(http, ["m1", "m2"])["name"])
    assert done["metadata"]["batchStats"]["successfulRequestCount"] == "3"
    assert len(keys_of(done)) == 2


def test_cut_downloads_has_nothing_to_cut_in_an_inline_batch(clock, emulator, http):
    emulator.configure(cut_downloads=3)
    done = ended(clock, http, create(http, ["w1", "w2"])["name"])
    assert sorted(keys_of(done)) == ["w1", "w2"]
    assert emulator.stats()["downloads"] == {}


def test_keyless_responses_answer_without_the_requests_metadata(clock, emulator, http):
    emulator.configure(keyless_responses=True)
    done = ended(clock, http, create(http, ["k1", "k2"])["name"])
    entries = done["response"]["inlinedResponses"]["inlinedResponses"]
    assert len(entries) == 2 and all("metadata" not in entry for entry in entries)
    assert emulator.stats()["inferences"] == {"k1": 1, "k2": 1}  # run and paid for all the same


def test_every_common_knob_is_accepted_as_a_keyword():
    with GeminiEmulator(**asdict(FaultKnobs())) as emulator:
        assert emulator.config() == {**asdict(FaultKnobs()), "keyless_responses": False}
    with pytest.raises(ApiError) as refused:
        GeminiEmulator(no_such_knob=1)
    assert refused.value.body["error"]["status"] == "INVALID_ARGUMENT"


# --- the Files API and batches made from a file ---------------------------------------------------


def jsonl(keys, text: str = "Write a description.\nTitle: Ash bowl") -> bytes:
    return b"".join(
        json.dumps({"key": key, "request": entry(key, text)["request"]}).encode() + b"\n" for key in keys
    )


def root_of(emulator) -> str:
    return emulator.base_url.removesuffix("/v1beta")


def start_upload(emulator, content: bytes, display_name: str = "bd_intent") -> httpx.Response:
    return httpx.post(
        f"{root_of(emulator)}/upload/v1beta/files",
        headers={
            **HEADERS,
            "X-Goog-Upload-Protocol": "resumable",
            "X-Goog-Upload-Command": "start",
            "X-Goog-Upload-Header-Content-Length": str(len(content)),
            "X-Goog-Upload-Header-Content-Type": "application/jsonl",
        },
        json={"file": {"displayName": display_name}},
    )


def upload(emulator, content: bytes, display_name: str = "bd_intent") -> dict:
    started = start_upload(emulator, content, display_name)
    assert started.status_code == 200 and started.headers["x-goog-upload-status"] == "active"
    done = httpx.post(
        started.headers["x-goog-upload-url"],
        headers={"X-Goog-Upload-Command": "upload, finalize", "X-Goog-Upload-Offset": "0"},
        content=content,
    )
    assert done.status_code == 200 and done.headers["x-goog-upload-status"] == "final", done.text
    return done.json()["file"]


def create_from_file(http, file_name: str, display_name: str = "bd_intent") -> dict:
    payload = {"batch": {"displayName": display_name, "inputConfig": {"fileName": file_name}}}
    response = http.post("/models/gemini-2.5-flash:batchGenerateContent", json=payload)
    assert response.status_code == 200, response.text
    return response.json()


def download(emulator, file_name: str, *, sdk_path: bool = False) -> httpx.Response:
    prefix = "/v1beta" if sdk_path else "/download/v1beta"
    return httpx.get(
        f"{root_of(emulator)}{prefix}/{file_name}:download", params={"alt": "media"}, headers=HEADERS
    )


def file_lines(emulator, operation: dict) -> list:
    name = operation["response"]["responsesFile"]
    response = download(emulator, name)
    assert response.status_code == 200
    return [json.loads(text) for text in response.text.splitlines()]


def test_a_resumable_upload_keeps_a_file_in_chunks_at_their_offsets(emulator, http):
    content = jsonl(["a", "b"])
    started = start_upload(emulator, content, "bd_up")
    url = started.headers["x-goog-upload-url"]
    assert "upload_id=" in url and url.startswith(f"{root_of(emulator)}/upload/v1beta/files?")

    first = httpx.post(
        url, headers={"X-Goog-Upload-Command": "upload", "X-Goog-Upload-Offset": "0"}, content=content[:10]
    )
    skipped = httpx.post(
        url,
        headers={"X-Goog-Upload-Command": "upload, finalize", "X-Goog-Upload-Offset": "11"},
        content=content[11:],
    )
    last = httpx.post(
        url,
        headers={"X-Goog-Upload-Command": "upload, finalize", "X-Goog-Upload-Offset": "10"},
        content=content[10:],
    )

    assert first.headers["x-goog-upload-status"] == "active" and first.content == b""
    assert skipped.status_code == 400 and "Offset 11" in skipped.json()["error"]["message"]
    stored = last.json()["file"]
    assert last.headers["x-goog-upload-status"] == "final"
    assert stored["name"].startswith("files/") and stored["displayName"] == "bd_up"
    assert (stored["sizeBytes"], stored["mimeType"], stored["state"], stored["source"]) == (
        str(len(content)),
        "application/jsonl",
        "ACTIVE",
        "UPLOADED",
    )
    assert http.get(f"/{stored['name']}").json() == stored
    # The session is used up; a finished upload cannot be appended to.
    assert (
        httpx.post(url, headers={"X-Goog-Upload-Command": "upload", "X-Goog-Upload-Offset": "0"}).status_code
        == 404
    )


def test_an_upload_needs_the_key_the_resumable_protocol_and_its_announced_size(emulator):
    root = root_of(emulator)
    assert (
        httpx.post(
            f"{root}/upload/v1beta/files",
            headers={"X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start"},
        ).status_code
        == 403
    )
    plain = httpx.post(f"{root}/upload/v1beta/files", headers=HEADERS, content=b"x")
    assert plain.status_code == 400 and "resumable" in plain.json()["error"]["message"]
    started = start_upload(emulator, b"12345")
    short = httpx.post(
        started.headers["x-goog-upload-url"],
        headers={"X-Goog-Upload-Command": "upload, finalize", "X-Goog-Upload-Offset": "0"},
        content=b"1234",
    )
    assert short.status_code == 400 and "5 were announced" in short.json()["error"]["message"]
    assert emulator.stats()["files"] == {}


def test_a_batch_from_a_file_answers_in_a_responses_file_of_keyed_lines(clock, emulator, http):
    stored = upload(emulator, jsonl(["f1", "f2", "f3"]))
    created = create_from_file(http, stored["name"], "bd_file")
    assert created["metadata"]["inputConfig"] == {"fileName": stored["name"]}
    assert created["metadata"]["batchStats"]["requestCount"] == "3"

    done = ended(clock, http, created["name"])

    name = done["response"]["responsesFile"]
    assert done["metadata"]["output"] == {"responsesFile": name}
    assert "inlinedResponses" not in done["response"] and name.startswith("files/batch-")
    lines = file_lines(emulator, done)
    assert sorted(line["key"] for line in lines) == ["f1", "f2", "f3"]
    assert all(set(line) == {"key", "response"} for line in lines)
    assert download(emulator, name, sdk_path=True).content == download(emulator, name).content
    generated = http.get(f"/{name}").json()
    assert generated["source"] == "GENERATED" and generated["downloadUri"].endswith(
        f"/{name}:download?alt=media"
    )
    assert emulator.stats()["inferences"] == {"f1": 1, "f2": 1, "f3": 1}


def test_only_generated_files_download_with_alt_media_and_the_key(clock, emulator, http):
    stored = upload(emulator, jsonl(["d1"]))
    done = ended(clock, http, create_from_file(http, stored["name"])["name"])
    name = done["response"]["responsesFile"]
    root = root_of(emulator)

    assert download(emulator, stored["name"]).status_code == 400
    assert httpx.get(f"{root}/download/v1beta/{name}:download", headers=HEADERS).status_code == 400
    assert httpx.get(f"{root}/download/v1beta/{name}:download", params={"alt": "media"}).status_code == 403
    assert download(emulator, "files/nope").status_code == 403


def test_a_batch_from_a_missing_or_empty_file_is_refused_and_a_bad_line_fails_it(clock, emulator, http):
    payload = {"batch": {"displayName": "bd_x", "inputConfig": {"fileName": "files/nope"}}}
    missing = http.post("/models/gemini-2.5-flash:batchGenerateContent", json=payload)
    assert missing.status_code == 400 and "not found" in missing.json()["error"]["message"]
    empty = upload(emulator, b"\n")
    payload["batch"]["inputConfig"]["fileName"] = empty["name"]
    assert http.post("/models/gemini-2.5-flash:batchGenerateContent", json=payload).status_code == 400
    assert emulator.stats()["batches"] == 0

    broken = upload(emulator, jsonl(["b1"]) + b"{not json\n")
    done = ended(clock, http, create_from_file(http, broken["name"])["name"])

    assert done["metadata"]["state"] == "BATCH_STATE_FAILED"
    assert "line 2" in done["error"]["message"] and "response" not in done


def test_cut_downloads_cuts_a_responses_file_mid_line(clock, emulator, http):
    done = ended(
        clock,
        http,
        create_from_file(http, upload(emulator, jsonl([f"c{n}" for n in range(20)]))["name"])["name"],
    )
    name = done["response"]["responsesFile"]
    whole = download(emulator, name).content
    emulator.configure(cut_downloads=1)

    with pytest.raises(httpx.TransportError):
        download(emulator, name)
    again = download(emulator, name)

    assert again.content == whole
    assert emulator.stats()["downloads"] == {name: 3}


def test_a_file_batchs_lines_are_spoiled_as_inline_ones_are(clock, emulator, http):
    emulator.configure(duplicate_lines=1.0, unknown_lines=1, malformed_lines=2)
    done = ended(clock, http, create_from_file(http, upload(emulator, jsonl(["s1", "s2"]))["name"])["name"])
    texts = download(emulator, done["response"]["responsesFile"]).text.splitlines()

    readable = []
    for text in texts:
        try:
            readable.append(json.loads(text))
        except ValueError:
            readable.append(None)
    assert readable.count(None) == 1
    keys = sorted(str(line.get("key")) for line in readable if line)
    assert keys == ["None", "s1", "s1", "s2", "s2", "unknown-1"]


def test_keyless_responses_write_file_lines_without_a_key(clock, emulator, http):
    emulator.configure(keyless_responses=True)
    done = ended(clock, http, create_from_file(http, upload(emulator, jsonl(["k1", "k2"]))["name"])["name"])
    lines = file_lines(emulator, done)
    assert len(lines) == 2 and all("key" not in line and "response" in line for line in lines)


def test_a_cancelled_file_batch_keeps_what_ran_in_its_file(clock, emulator, http):
    emulator.configure(per_request_ms=50)
    created = create_from_file(http, upload(emulator, jsonl([f"x{n}" for n in range(40)]))["name"])
    clock.advance(ms=200)  # 10 ms pending, then three requests of 50 ms
    assert http.post(f"/{created['name']}:cancel").json() == {}
    done = http.get(f"/{created['name']}").json()
    assert done["metadata"]["state"] == "BATCH_STATE_CANCELLED"
    assert len(file_lines(emulator, done)) == 3
