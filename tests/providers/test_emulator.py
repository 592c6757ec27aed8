"""The provider emulator over real HTTP: OpenAI's Files + Batch wire protocol, statuses and fault knobs."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest
from openai import OpenAI

from ledger.emulators import textgen
from ledger.emulators.clock import TestClock
from ledger.emulators.openai import Emulator, _shared

ENDPOINT = "/v1/chat/completions"
ENDED = {"completed", "failed", "expired", "cancelled"}
BATCH_KEYS = {
    "id",
    "object",
    "endpoint",
    "model",
    "errors",
    "input_file_id",
    "completion_window",
    "status",
    "output_file_id",
    "error_file_id",
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "request_counts",
    "usage",
    "metadata",
}
SCHEMA = {
    "type": "object",
    "properties": {
        "headline": {"type": "string", "minLength": 3, "maxLength": 30},
        "description": {"type": "string", "minLength": 40, "maxLength": 1200},
        "bullets": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 2},
    },
    "required": ["headline", "description", "bullets"],
    "additionalProperties": False,
}


@pytest.fixture
def clock():
    return TestClock()


@pytest.fixture
def emulator(clock):
    with Emulator(per_request_ms=2, validating_ms=100, finalizing_ms=20, seed=7, clock=clock) as running:
        yield running


@pytest.fixture
def api(emulator):
    with httpx.Client(
        base_url=emulator.base_url, headers={"Authorization": "Bearer test"}, timeout=10
    ) as client:
        yield client


def line(custom_id: str, *, model: str = "gpt-4o-mini", **body: object) -> dict:
    prompt = f"Write a description.\nTitle: Oak board {custom_id}\nFacts:\n- material: oak\n- colour: natural"
    messages = [{"role": "system", "content": "Use only the facts."}, {"role": "user", "content": prompt}]
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": ENDPOINT,
        "body": {"model": model, "messages": messages, **body},
    }


def lines(n: int, prefix: str = "item") -> list[dict]:
    return [line(f"{prefix}-{i}") for i in range(n)]


def upload(api: httpx.Client, requests: list[dict] | bytes) -> str:
    data = (
        requests if isinstance(requests, bytes) else "".join(json.dumps(r) + "\n" for r in requests).encode()
    )
    response = api.post("/files", files={"file": ("batch.jsonl", data)}, data={"purpose": "batch"})
    assert response.status_code == 200, response.text
    return response.json()["id"]


def submit(api: httpx.Client, requests: list[dict] | bytes, **extra: object) -> dict:
    body = {"input_file_id": upload(api, requests), "endpoint": ENDPOINT, "completion_window": "24h", **extra}
    response = api.post("/batches", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def wait(clock: TestClock, api: httpx.Client, batch_id: str, until: set[str] = ENDED) -> dict:
    """The batch once it reaches a status in `until`, the emulator's clock moved 10 ms between polls."""
    for _ in range(10_000):
        batch = api.get(f"/batches/{batch_id}").json()
        if batch["status"] in until:
            return batch
        clock.advance(ms=10)
    raise AssertionError(f"batch {batch_id} never reached {until}")


def results(api: httpx.Client, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    response = api.get(f"/files/{file_id}/content")
    assert response.status_code == 200
    return [json.loads(text) for text in response.text.splitlines()]


def assert_error_envelope(response: httpx.Response, status: int) -> None:
    assert response.status_code == status
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_a_batch_runs_to_completed_with_every_key_and_a_line_per_request(clock, api):
    sent = lines(6)
    created = submit(api, sent, metadata={"job": "nightly"})

    assert set(created) == BATCH_KEYS
    assert created["status"] == "validating"
    assert created["object"] == "batch" and created["id"].startswith("batch_")
    assert created["expires_at"] == created["created_at"] + 86400
    assert created["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert created["metadata"] == {"job": "nightly"}

    batch = wait(clock, api, created["id"])
    assert set(batch) == BATCH_KEYS
    assert batch["status"] == "completed"
    assert batch["model"] == "gpt-4o-mini"
    assert batch["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
    assert batch["created_at"] <= batch["in_progress_at"] <= batch["finalizing_at"] <= batch["completed_at"]
    assert batch["failed_at"] is None and batch["errors"] is None and batch["error_file_id"] is None

    output = results(api, batch["output_file_id"])
    assert {r["custom_id"] for r in output} == {r["custom_id"] for r in sent}
    for result in output:
        assert result["id"].startswith("batch_req_") and result["error"] is None
        assert result["response"]["status_code"] == 200
        completion = result["response"]["body"]
        assert completion["object"] == "chat.completion"
        assert completion["choices"][0]["message"]["content"].startswith(
            ("Introducing", "Meet", "Say", "Discover")
        )
    usage = batch["usage"]
    assert usage["input_tokens"] == sum(r["response"]["body"]["usage"]["prompt_tokens"] for r in output)
    assert usage["output_tokens"] == sum(r["response"]["body"]["usage"]["completion_tokens"] for r in output)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    output_file = api.get(f"/files/{batch['output_file_id']}").json()
    assert output_file["purpose"] == "batch_output" and output_file["object"] == "file"


def test_statuses_follow_the_documented_order(clock, emulator, api):
    emulator.configure(per_request_ms=30)
    batch_id = submit(api, lines(10))["id"]
    seen = []
    while not seen or seen[-1] not in ENDED:
        status = api.get(f"/batches/{batch_id}").json()["status"]
        if not seen or seen[-1] != status:
            seen.append(status)
        clock.advance(ms=10)
    assert seen == ["validating", "in_progress", "finalizing", "completed"]


def test_an_upload_comes_back_byte_for_byte(api):
    data = ("".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in lines(3)) + "é" * 200_000).encode()
    file_id = upload(api, data)

    assert api.get(f"/files/{file_id}/content").content == data
    described = api.get(f"/files/{file_id}").json()
    assert described["bytes"] == len(data) and described["purpose"] == "batch"
    assert described["expires_at"] > described["created_at"]


def duplicate(sent: list[dict]) -> None:
    sent[1]["custom_id"] = sent[0]["custom_id"]


def second_model(sent: list[dict]) -> None:
    sent[2]["body"]["model"] = "gpt-4o"


def wrong_method(sent: list[dict]) -> None:
    sent[1]["method"] = "GET"


def wrong_url(sent: list[dict]) -> None:
    sent[1]["url"] = "/v1/embeddings"


@pytest.mark.parametrize(
    ("spoil", "code", "line_number"),
    [
        (duplicate, "duplicate_custom_id", 2),
        (second_model, "mismatched_model", None),
        (wrong_method, "invalid_method", 2),
        (wrong_url, "mismatched_url", 2),
    ],
)
def test_a_bad_input_file_fails_validation(clock, api, emulator, spoil, code, line_number):
    sent = lines(3)
    spoil(sent)

    batch = wait(clock, api, submit(api, sent)["id"])

    assert batch["status"] == "failed" and batch["failed_at"] is not None
    assert batch["in_progress_at"] is None and batch["output_file_id"] is None
    error = batch["errors"]["data"][0]
    assert set(error) == {"code", "message", "param", "line"}
    assert (error["code"], error["line"]) == (code, line_number)
    assert emulator.stats()["inferences"] == {}


def test_a_line_that_is_not_json_fails_validation(clock, api):
    data = b'{"custom_id": "a"\n' + json.dumps(line("b")).encode() + b"\n"

    batch = wait(clock, api, submit(api, data)["id"])

    assert batch["status"] == "failed"
    assert {(e["code"], e["line"]) for e in batch["errors"]["data"]} == {("invalid_json_line", 1)}


def test_a_wrong_window_is_refused_when_the_batch_is_created(api, emulator):
    body = {"input_file_id": upload(api, lines(1)), "endpoint": ENDPOINT, "completion_window": "48h"}

    refused = api.post("/batches", json=body)

    assert_error_envelope(refused, 400)
    assert (refused.json()["error"]["param"], refused.json()["error"]["code"]) == (
        "completion_window",
        "invalid_value",
    )
    assert emulator.stats()["batches"] == 0


def test_fail_rate_writes_server_errors_to_the_error_file(clock, emulator, api):
    emulator.configure(fail_rate=0.5)
    sent = lines(20)

    batch = wait(clock, api, submit(api, sent)["id"])
    output, errors = results(api, batch["output_file_id"]), results(api, batch["error_file_id"])

    assert batch["status"] == "completed"
    assert output and errors
    assert batch["request_counts"] == {"total": 20, "completed": len(output), "failed": len(errors)}
    assert {r["custom_id"] for r in output} | {r["custom_id"] for r in errors} == {
        r["custom_id"] for r in sent
    }
    for error in errors:
        assert error["error"] is None and error["response"]["status_code"] == 500
        assert error["response"]["body"]["error"]["type"] == "server_error"
        assert set(error["response"]["body"]["error"]) == {"message", "type", "param", "code"}

    # The same seed picks the same unlucky requests.
    again_clock = TestClock()
    with Emulator(per_request_ms=0, seed=7, fail_rate=0.5, clock=again_clock) as again:
        with httpx.Client(base_url=again.base_url, headers={"Authorization": "Bearer t"}) as other:
            rerun = wait(again_clock, other, submit(other, sent)["id"])
            assert {r["custom_id"] for r in results(other, rerun["error_file_id"])} == {
                r["custom_id"] for r in errors
            }


def test_when_every_request_fails_the_output_file_is_null(clock, emulator, api):
    emulator.configure(fail_rate=1)

    batch = wait(clock, api, submit(api, lines(3))["id"])

    assert batch["status"] == "completed"
    assert batch["output_file_id"] is None and batch["error_file_id"] is not None
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 3}


def test_expire_rate_expires_the_batch_and_keeps_what_finished(clock, emulator, api):
    emulator.configure(expire_rate=0.5)

    batch = wait(clock, api, submit(api, lines(20))["id"])
    output, errors = results(api, batch["output_file_id"]), results(api, batch["error_file_id"])

    assert batch["status"] == "expired"
    assert batch["expired_at"] is not None and batch["completed_at"] is None
    assert output and errors and len(output) + len(errors) == 20
    for error in errors:
        assert error["response"] is None
        assert error["error"]["code"] == "batch_expired"


def test_cancel_keeps_finished_lines_and_marks_the_rest_cancelled(clock, emulator, api):
    emulator.configure(per_request_ms=40)
    sent = lines(20)
    batch_id = submit(api, sent)["id"]
    wait(clock, api, batch_id, until={"in_progress"})  # seen within 10 ms of its start
    clock.advance(ms=90)  # two requests of 40 ms, and part of a third

    cancelling = api.post(f"/batches/{batch_id}/cancel").json()
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"] is not None
    finished = cancelling["request_counts"]["completed"]
    assert finished == 2

    batch = wait(clock, api, batch_id)
    output, errors = results(api, batch["output_file_id"]), results(api, batch["error_file_id"])
    assert batch["status"] == "cancelled" and batch["cancelled_at"] is not None
    assert len(output) == finished and len(errors) == 20 - finished
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert {r["custom_id"] for r in output + errors} == {r["custom_id"] for r in sent}
    assert set(emulator.stats()["inferences"]) == {r["custom_id"] for r in output}

    assert_error_envelope(api.post(f"/batches/{batch_id}/cancel"), 400)


def test_listing_pages_newest_first(api):
    input_file = upload(api, lines(1))
    body = {"input_file_id": input_file, "endpoint": ENDPOINT, "completion_window": "24h"}
    created = [api.post("/batches", json=body).json()["id"] for _ in range(5)]
    newest_first = created[::-1]

    first = api.get("/batches", params={"limit": 2}).json()
    assert first["object"] == "list"
    assert [b["id"] for b in first["data"]] == newest_first[:2]
    assert (first["first_id"], first["last_id"], first["has_more"]) == (
        newest_first[0],
        newest_first[1],
        True,
    )
    second = api.get("/batches", params={"limit": 2, "after": first["last_id"]}).json()
    assert [b["id"] for b in second["data"]] == newest_first[2:4] and second["has_more"]
    last = api.get("/batches", params={"limit": 2, "after": second["last_id"]}).json()
    assert [b["id"] for b in last["data"]] == newest_first[4:] and not last["has_more"]
    assert_error_envelope(api.get("/batches", params={"limit": 0}), 400)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/files/file-nope"),
        ("GET", "/files/file-nope/content"),
        ("GET", "/batches/batch_nope"),
        ("POST", "/batches/batch_nope/cancel"),
        ("GET", "/nothing-here"),
    ],
)
def test_unknown_ids_get_a_404_envelope(api, method, path):
    assert_error_envelope(api.request(method, path), 404)


def test_bad_requests_get_a_400_envelope(api):
    missing = api.post("/batches", json={"endpoint": ENDPOINT, "completion_window": "24h"})
    assert_error_envelope(missing, 400)
    assert missing.json()["error"]["param"] == "input_file_id"
    assert_error_envelope(api.post("/batches", content=b"{not json"), 400)
    assert_error_envelope(api.post("/files", data={"purpose": "batch"}, files={"other": ("x", b"")}), 400)


def test_a_request_without_an_api_key_gets_401(emulator):
    response = httpx.get(f"{emulator.base_url}/batches")
    assert_error_envelope(response, 401)


def test_a_json_schema_response_format_gets_json_matching_the_schema(clock, api):
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "draft", "schema": SCHEMA, "strict": True},
    }
    sent = [line(f"json-{i}", response_format=response_format) for i in range(5)]

    batch = wait(clock, api, submit(api, sent)["id"])

    for result in results(api, batch["output_file_id"]):
        draft = json.loads(result["response"]["body"]["choices"][0]["message"]["content"])
        jsonschema.validate(draft, SCHEMA)
        assert "oak" in draft["description"]


def test_textgen_writes_only_from_the_title_and_facts_and_is_deterministic():
    body = line("x", max_tokens=600)["body"]
    content, usage = textgen.generate(body)

    assert textgen.generate(body) == (content, usage)
    assert "Oak board x" in content and "oak" in content and "natural" in content
    assert 2 <= content.count(". ") + 1 <= 4
    assert "waterproof" not in content.lower()
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    truncated, truncated_usage = textgen.generate({**body, "max_tokens": 4})
    assert len(truncated) < len(content) and truncated_usage["completion_tokens"] == 4


def test_stats_count_each_inference_so_double_payment_shows(clock, emulator, api):
    emulator.configure(fail_rate=0.5)
    sent = lines(10)
    first = wait(clock, api, submit(api, sent)["id"])
    failed = {r["custom_id"] for r in results(api, first["error_file_id"])}
    succeeded = {r["custom_id"] for r in sent} - failed

    stats = httpx.get(emulator.base_url.removesuffix("/v1") + "/_emulator/stats").json()
    assert stats["inferences"] == dict.fromkeys(succeeded, 1)
    assert stats["batches"] == 1 and stats["files"] == 3

    # Sending a request that already succeeded is paid for again, and the count shows it.
    emulator.configure(fail_rate=0)
    wait(clock, api, submit(api, [r for r in sent if r["custom_id"] in succeeded][:1])["id"])
    assert sorted(emulator.stats()["inferences"].values()) == [1] * (len(succeeded) - 1) + [2]


def test_concurrent_clients_each_get_their_own_batch_run_once(clock, emulator, api):
    def run(n: int) -> dict:
        with httpx.Client(base_url=emulator.base_url, headers={"Authorization": "Bearer t"}) as own:
            return wait(clock, own, submit(own, lines(5, prefix=f"c{n}"))["id"])

    with ThreadPoolExecutor(max_workers=8) as pool:
        batches = list(pool.map(run, range(8)))

    assert {b["status"] for b in batches} == {"completed"}
    assert len({b["id"] for b in batches}) == 8
    assert emulator.stats()["inferences"] == {f"c{n}-{i}": 1 for n in range(8) for i in range(5)}


def test_the_config_endpoint_changes_the_knobs(clock, emulator, api):
    root = emulator.base_url.removesuffix("/v1")
    answer = httpx.post(f"{root}/_emulator/config", json={"fail_rate": 1, "per_request_ms": 0})
    knobs = answer.json()  # every knob; the fault switches have their own tests
    assert (knobs["fail_rate"], knobs["expire_rate"], knobs["per_request_ms"]) == (1, 0.0, 0)

    batch = wait(clock, api, submit(api, lines(2))["id"])
    assert batch["request_counts"]["failed"] == 2
    assert_error_envelope(httpx.post(f"{root}/_emulator/config", json={"fail_rate": 2}), 400)


def test_the_official_sdk_understands_every_answer(clock, emulator):
    client = OpenAI(base_url=emulator.base_url, api_key="test", max_retries=0)
    data = "".join(json.dumps(r) + "\n" for r in lines(4, prefix="sdk")).encode()

    uploaded = client.files.create(file=("batch.jsonl", data), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(data)
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint=ENDPOINT, completion_window="24h", metadata={"job": "sdk"}
    )
    assert batch.status == "validating" and batch.metadata == {"job": "sdk"}
    while batch.status not in ENDED:
        clock.advance(ms=10)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == 4
    assert batch.usage.total_tokens > 0

    output = client.files.content(batch.output_file_id).text.splitlines()
    assert {json.loads(text)["custom_id"] for text in output} == {f"sdk-{i}" for i in range(4)}

    emulator.configure(per_request_ms=1000)
    slow = client.batches.create(input_file_id=uploaded.id, endpoint=ENDPOINT, completion_window="24h")
    assert client.batches.cancel(slow.id).status == "cancelling"
    others = [
        client.batches.create(input_file_id=uploaded.id, endpoint=ENDPOINT, completion_window="24h")
        for _ in range(3)
    ]
    listed = [b.id for b in client.batches.list(limit=2)]  # iterating follows `after` across pages
    assert listed == [b.id for b in reversed([batch, slow, *others])]

    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(batch.id)


def test_textgen_reads_each_fact_from_its_own_line():
    prompt = "Title: Oak board\nFacts:\n- wood: oak\n- : no key\n- empty:\n- colour: natural: oiled\n-size:40 cm\nnot - a: fact"
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}]}

    assert textgen.facts_in(prompt) == [("wood", "oak"), ("colour", "natural: oiled"), ("size", "40 cm")]
    content, _ = textgen.generate(body)
    assert "oak" in content and "natural: oiled" in content and "40 cm" in content
    assert "no key" not in content and "empty" not in content and "fact" not in content


def test_textgen_writes_braces_in_a_title_or_fact_as_they_are():
    schema = {
        "type": "object",
        "properties": {"headline": {"type": "string"}, "description": {"type": "string"}},
    }
    response_format = {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}}

    headlines = set()
    for n in range(20):  # enough requests for every opener, frame and headline template
        title = f"Box {{t}} of {{title}} {n}"
        prompt = f"Title: {title}\n- lid: {{list}} and {{v}}\n- size: 4 cm\n- wood: oak\n- colour: red"
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": prompt}],
            "response_format": response_format,
        }
        draft = json.loads(textgen.generate(body)[0])
        assert draft["headline"] in {title, f"Introducing the {title}", f"Meet the {title}"}
        assert f"the {title}." in draft["description"] and "{list} and {v}" in draft["description"]
        headlines.add(draft["headline"].removesuffix(title))
    assert headlines == {"", "Introducing the ", "Meet the "}


def test_textgen_counts_every_message_of_the_prompt_including_the_system_one():
    user = "Title: Oak\n- wood: oak"

    def usage(system: str) -> dict:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return textgen.generate({"model": "m", "messages": messages})[1]

    for system in ("Be brief.", "Be brief and use only the facts you are given.", "Be brief."):
        expected = textgen.count_tokens(system) + 3 + textgen.count_tokens(user) + 3
        assert usage(system)["prompt_tokens"] == expected


def test_a_units_equal_response_formats_are_kept_once_and_nan_apart_from_null():
    def response_format(minimum: object) -> dict:
        return {
            "type": "json_schema",
            "json_schema": {"name": "o", "schema": {"type": "number", "minimum": minimum}},
        }

    formats: dict = {}
    first = response_format(None)
    assert _shared(formats, first) is first
    assert _shared(formats, response_format(None)) is first
    nan = response_format(float("nan"))  # the same JSON text as null, but not the same answer
    assert _shared(formats, nan) is nan
    other = response_format(1)
    assert _shared(formats, other) is other and _shared(formats, response_format(1)) is other


def test_textgen_words_depend_on_the_request():
    def body(title: str) -> dict:
        return {"model": "m", "messages": [{"role": "user", "content": f"Title: {title}\n- wood: oak"}]}

    answers = {textgen.generate(body(f"Board {n}"))[0].replace(f"Board {n}", "X") for n in range(40)}
    assert len(answers) > 3  # openers, frames and closers vary from request to request
