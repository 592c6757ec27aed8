"""What an adapter does with answers nobody promised: never an exception from a call but
ProviderError (or AnswerLost), never a result lost or sent again when it may have succeeded."""

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from ledger.emulators.clock import TestClock
from ledger.providers import anthropic, cloudflare, gemini, gemini_results, openai
from ledger.providers.base import (
    AnswerLost,
    InferenceRequest,
    ProviderError,
    ResultLine,
    UnreadableLine,
    token_count,
)
from ledger.providers.openai_compatible import CompatibleServerProvider
from ledger.states import ReasonCode


def request(custom_id: str = "bd-1-1") -> InferenceRequest:
    return InferenceRequest(
        custom_id=custom_id,
        model="m",
        system_message="s",
        user_message="u",
        output_schema=None,
        max_output_tokens=10,
    )


# 1. One token count for every adapter; odd values read as lines, never raised.


@pytest.mark.parametrize(
    ("value", "count"),
    [
        (12, 12),
        ("12", 12),
        (3.7, 3),
        ("many", 0),
        (math.inf, 0),
        (math.nan, 0),
        (-4, 0),
        (True, 0),
        ([1], 0),
        (None, 0),
        ({"a": 1}, 0),
    ],
)
def test_a_token_count_is_a_finite_non_negative_number_or_zero(value, count):
    assert token_count(value) == count


def openai_line(response: object = None, **body_parts) -> str:
    body = {"choices": [{"message": {"content": '{"a": 1}'}}], "usage": {"prompt_tokens": 5}}
    body.update(body_parts)
    if response is None:
        response = {"status_code": 200, "body": body}
    return json.dumps({"custom_id": "bd-1-1", "response": response})


@pytest.mark.parametrize(
    "text",
    [
        openai_line(response=[1]),
        openai_line(usage=[1]),
        openai_line(usage={"prompt_tokens": "many", "completion_tokens": 1e308 * 10}),
        '{"custom_id": "bd-1-1", "response": {"status_code": 200, "body": {"choices": [{"message": '
        '{"content": "x"}}], "usage": {"prompt_tokens": Infinity, "completion_tokens": NaN}}}}',
        openai_line(choices=[{"message": {"content": ["x"]}}]),
        openai_line(choices=[{"message": "x"}]),
        openai_line(response={"status_code": 500, "body": [1]}),
        '{"custom_id": "bd-1-1", "error": {"code": 5, "message": ["x"]}}',
    ],
)
def test_an_openai_line_of_odd_values_is_a_line_never_an_exception(text):
    line = openai.parse_result_line(3, text)
    assert isinstance(line, ResultLine) and line.custom_id == "bd-1-1"
    assert isinstance(line.content, str)
    if line.succeeded:
        assert line.input_tokens in (0, 5) and line.output_tokens == 0
        # What is kept is JSON a database stores: no NaN, no Infinity.
        json.dumps(line.usage, allow_nan=False)


def test_openai_content_that_is_not_text_is_an_unreadable_result_not_a_success():
    line = openai.parse_result_line(3, openai_line(choices=[{"message": {"content": ["x"]}}]))
    assert not line.succeeded
    assert (line.reason, line.transient, line.error_code) == (
        ReasonCode.UNREADABLE_RESULT,
        False,
        "unreadable_result",
    )


def test_a_parser_that_fails_on_a_line_with_a_custom_id_records_it_as_unreadable_never_missing(
    monkeypatch,
):
    """A line whose custom_id is known must not become `missing_result` (re-sent: it may have
    succeeded): an unexpected exception inside the parser gives a permanent failed line."""

    def broken(*args, **kwargs):
        raise KeyError("surprise")

    monkeypatch.setattr(openai, "_parse_line", broken)
    line = openai.parse_result_line(4, openai_line())
    assert isinstance(line, ResultLine) and line.custom_id == "bd-1-1"
    assert (line.succeeded, line.reason, line.transient) == (False, ReasonCode.UNREADABLE_RESULT, False)
    monkeypatch.setattr(anthropic, "_parse_line", broken)
    line = anthropic.parse_result_line(4, '{"custom_id": "bd-1-1", "result": {}}')
    assert (line.custom_id, line.reason) == ("bd-1-1", ReasonCode.UNREADABLE_RESULT)
    monkeypatch.setattr(gemini_results, "_parse_inlined", broken)
    line = gemini_results.parse_inlined(4, {"metadata": {"key": "bd-1-1"}})
    assert (line.custom_id, line.reason) == ("bd-1-1", ReasonCode.UNREADABLE_RESULT)
    assert isinstance(gemini_results.parse_inlined(5, {"metadata": {}}), UnreadableLine)


def anthropic_line(**usage) -> str:
    message = {"content": [{"type": "text", "text": "hi"}], "usage": usage}
    return json.dumps({"custom_id": "bd-1-1", "result": {"type": "succeeded", "message": message}})


@pytest.mark.parametrize(
    "text",
    [
        anthropic_line(input_tokens="x", output_tokens=2),
        anthropic_line(input_tokens=math.inf, output_tokens=2),
        anthropic_line(input_tokens=[1], output_tokens=2),
        anthropic_line(input_tokens=1e400, output_tokens=2),
    ],
)
def test_an_anthropic_line_with_odd_token_counts_is_a_success_with_zero_input_tokens(text):
    line = anthropic.parse_result_line(1, text)
    assert isinstance(line, ResultLine) and line.succeeded
    assert (line.content, line.input_tokens, line.output_tokens) == ("hi", 0, 2)
    json.dumps(line.usage, allow_nan=False)


@pytest.mark.parametrize("value", [math.inf, "1e999", "x", [1], -1])
def test_a_gemini_response_with_odd_token_counts_is_a_success_with_zero_tokens(value):
    entry = {
        "metadata": {"key": "bd-1-1"},
        "response": {
            "candidates": [{"content": {"parts": [{"text": "hi"}]}}],
            "usageMetadata": {"promptTokenCount": value, "candidatesTokenCount": "3"},
        },
    }
    line = gemini_results.parse_inlined(1, entry)
    assert isinstance(line, ResultLine) and line.succeeded
    assert (line.input_tokens, line.output_tokens) == (0, 3)


def compatible_answer(answer: dict) -> ResultLine:
    provider = CompatibleServerProvider(client=httpx.Client(base_url="http://server.test/v1"))
    sent = httpx.Request("POST", "http://server.test/v1/chat/completions")
    return provider._read(request(), httpx.Response(200, json=answer, request=sent))


def test_an_openai_compatible_answer_with_odd_usage_is_read_with_zero_tokens():
    line = compatible_answer(
        {
            "choices": [{"message": {"content": "hi"}}],
            "usage": {"prompt_tokens": "many", "completion_tokens": 2},
        }
    )
    assert (line.succeeded, line.content, line.input_tokens, line.output_tokens) == (True, "hi", 0, 2)


def test_an_openai_compatible_answer_with_infinite_usage_keeps_only_json_a_database_stores():
    provider = CompatibleServerProvider(client=httpx.Client(base_url="http://server.test/v1"))
    sent = httpx.Request("POST", "http://server.test/v1/chat/completions")
    text = b'{"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": Infinity, "completion_tokens": NaN}}'
    line = provider._read(request(), httpx.Response(200, content=text, request=sent))
    assert (line.succeeded, line.input_tokens, line.output_tokens) == (True, 0, 0)
    json.dumps(line.usage, allow_nan=False)


@pytest.mark.parametrize("content", [["x"], {"a": 1}, 5])
def test_an_openai_compatible_answer_whose_content_is_not_text_is_unreadable(content):
    line = compatible_answer({"choices": [{"message": {"content": content}}]})
    assert (line.succeeded, line.reason, line.transient) == (False, ReasonCode.UNREADABLE_RESULT, False)


def test_cloudflare_usage_that_is_not_finite_is_shared_as_zero():
    provider = cloudflare.CloudflareBatchProvider(
        client=httpx.Client(base_url="http://cf.test"), account_id="a"
    )
    responses = [{"external_reference": "bd-1-1", "success": True, "result": {"response": "hi"}}]
    lines = list(provider.read_responses(responses, {"prompt_tokens": math.inf, "completion_tokens": "4"}))
    assert [(line.custom_id, line.input_tokens, line.output_tokens) for line in lines] == [("bd-1-1", 0, 4)]


# 2. Answers about a unit that are not the promised JSON object. The emulators always answer the
# promised shapes, so these few are served by a MockTransport.


def answering(provider_class, answers: dict[str, object], base_url: str = "http://provider.test/v1"):
    """The adapter with a client whose calls get `answers[path suffix]`: bytes as they are,
    anything else as JSON."""

    def handler(request: httpx.Request) -> httpx.Response:
        for suffix, answer in answers.items():
            if request.url.path.endswith(suffix):
                if isinstance(answer, bytes):
                    return httpx.Response(200, content=answer)
                return httpx.Response(200, json=answer)
        return httpx.Response(404, json={"error": {"message": "no such thing"}})

    client = httpx.Client(base_url=base_url, transport=httpx.MockTransport(handler))
    if provider_class is cloudflare.CloudflareBatchProvider:
        return provider_class(client=client, account_id="acct")
    return provider_class(client=client)


@pytest.mark.parametrize("answer", [b"<html>bad gateway</html>", b"", ["a"], "text", None])
def test_an_openai_status_answer_that_is_not_a_json_object_is_a_provider_error(answer):
    provider = answering(openai.OpenAIBatchProvider, {"/batches/b1": answer})
    with pytest.raises(ProviderError) as raised:
        provider.status("b1")
    assert not isinstance(raised.value, AnswerLost) and raised.value.transient
    with pytest.raises(ProviderError):
        list(provider.results("b1"))
    with pytest.raises(ProviderError):
        answering(openai.OpenAIBatchProvider, {"/batches": answer}).find_units(intent_key="k")


@pytest.mark.parametrize(
    "batch", [{"id": "b1"}, {"id": "b1", "status": None}, {"status": 7, "errors": ["x"]}]
)
def test_an_openai_batch_without_a_status_word_is_shown_as_a_word_and_polled_again(batch):
    status = answering(openai.OpenAIBatchProvider, {"/batches/b1": batch}).status("b1")
    assert isinstance(status.provider_status, str) and status.provider_status == "unknown"
    assert not status.ended


@pytest.mark.parametrize("answer", [b"not json", {}, {"id": None}, {"id": 17}, ["b1"]])
def test_an_openai_create_answered_without_a_batch_id_is_a_lost_answer(answer):
    provider = answering(openai.OpenAIBatchProvider, {"/files": {"id": "file-1"}, "/batches": answer})
    with pytest.raises(AnswerLost):
        provider.submit(requests=[request()], intent_key="k", metadata={})


@pytest.mark.parametrize("answer", [b"not json", {}])
def test_an_openai_upload_answered_without_a_file_id_is_an_ordinary_error(answer):
    # Nothing is created by an upload: trying it again is harmless, so it is not a lost answer.
    provider = answering(openai.OpenAIBatchProvider, {"/files": answer})
    with pytest.raises(ProviderError) as raised:
        provider.submit(requests=[request()], intent_key="k", metadata={})
    assert not isinstance(raised.value, AnswerLost)


def test_an_openai_listing_with_entries_of_odd_shapes_finds_only_the_readable_ones():
    page = {
        "data": [
            {"metadata": {"batchdesk_intent": "k"}},
            "b0",
            {"id": "b1", "metadata": ["k"]},
            {"id": "b2", "metadata": {"batchdesk_intent": "k"}},
        ],
        "has_more": False,
    }
    assert answering(openai.OpenAIBatchProvider, {"/batches": page}).find_units(intent_key="k") == ["b2"]


@pytest.mark.parametrize("answer", [b"not json", {}, {"id": None}, {"id": 5}])
def test_an_anthropic_create_answered_without_a_batch_id_is_a_lost_answer(answer):
    provider = answering(anthropic.AnthropicBatchProvider, {"/v1/messages/batches": answer}, "http://a.test")
    with pytest.raises(AnswerLost):
        provider.submit(requests=[request()], intent_key="k", metadata={})


def test_a_gemini_create_answered_with_what_is_not_json_is_a_lost_answer():
    provider = answering(
        gemini.GeminiBatchProvider, {":batchGenerateContent": b"<html>"}, "http://g.test/v1beta"
    )
    with pytest.raises(AnswerLost):
        provider.submit(requests=[request()], intent_key="k", metadata={})


# 3. A self-hosted server's answers: one that cannot be handled never costs the others.


def test_an_unexpected_fault_on_one_answer_keeps_every_other_answer_and_fails_that_one_for_good(monkeypatch):
    from ledger.emulators.openai_compatible import CompatibleServerEmulator

    with CompatibleServerEmulator(per_request_ms=0, seed=5) as emulator:
        provider = CompatibleServerProvider(client=httpx.Client(base_url=emulator.base_url), concurrency=4)
        read = provider._read

        def faulty_read(sent, response):
            if sent.custom_id == "bd-2-1":
                raise RuntimeError("a fault of ours")
            return read(sent, response)

        monkeypatch.setattr(provider, "_read", faulty_read)
        sent = [request(f"bd-{i}-1") for i in range(8)]
        lines = list(
            provider.results(provider.submit(requests=sent, intent_key="k", metadata={}), requests=sent)
        )

        assert sorted(line.custom_id for line in lines) == sorted(r.custom_id for r in sent)
        broken = {line.custom_id: line for line in lines if not line.succeeded}
        assert list(broken) == ["bd-2-1"]
        assert (broken["bd-2-1"].reason, broken["bd-2-1"].transient) == (ReasonCode.UNREADABLE_RESULT, False)
        # Answered once each: nothing is asked twice.
        assert set(emulator.stats()["inferences"].values()) == {1}


# 4. A Gemini batch that finished without its answers is asked again, never read as "no results".


def test_a_finished_gemini_batch_without_responses_is_asked_again_not_read_as_empty(monkeypatch):
    from ledger.emulators.gemini import GeminiEmulator

    clock = TestClock()
    with GeminiEmulator(per_request_ms=1, pending_ms=0, seed=5, clock=clock) as emulator:
        provider = gemini.GeminiBatchProvider(
            client=httpx.Client(base_url=emulator.base_url, headers={"x-goog-api-key": "k"})
        )
        sent = [request(f"bd-{i}-1") for i in range(3)]
        ref = provider.submit(requests=sent, intent_key="k", metadata={})
        clock.advance(seconds=1)
        assert provider.status(ref).provider_status == "BATCH_STATE_SUCCEEDED"
        # The batch ran (and was paid for), but its answer carries no responses.
        with emulator.lock:
            emulator._batches[ref.removeprefix("batches/")].inlined = None

        with pytest.raises(ProviderError) as raised:
            list(provider.results(ref))
        assert raised.value.transient and "gave no responses" in str(raised.value)


@pytest.mark.parametrize(
    ("operation", "said"),
    [
        ({"done": True, "metadata": {"state": "BATCH_STATE_SUCCEEDED"}}, "no responses"),
        ({"done": True}, "no responses"),
        ({"done": True, "response": {"inlinedResponses": {"inlinedResponses": []}}}, "no responses"),
    ],
)
def test_a_gemini_batch_done_without_inline_responses_is_a_provider_error(operation, said):
    provider = answering(gemini.GeminiBatchProvider, {"/batches/b1": operation}, "http://g.test/v1beta")
    with pytest.raises(ProviderError, match=said):
        list(provider.results("batches/b1"))


def test_a_gemini_batch_with_a_responses_file_is_read_from_the_download_beside_the_api():
    operation = {
        "done": True,
        "metadata": {"state": "BATCH_STATE_SUCCEEDED"},
        "response": {"responsesFile": "files/r1"},
    }
    line = {"key": "bd-1-1", "response": {"candidates": [{"content": {"parts": [{"text": "hi"}]}}]}}
    provider = answering(
        gemini.GeminiBatchProvider,
        {
            "/v1beta/batches/b1": operation,
            "/download/v1beta/files/r1:download": json.dumps(line).encode() + b"\n",
        },
        "http://g.test/v1beta",
    )
    [read] = provider.results("batches/b1")
    assert (read.custom_id, read.succeeded, read.content) == ("bd-1-1", True, "hi")


@pytest.mark.parametrize(
    ("answers", "said"),
    [
        ({"/download/v1beta/files/r1:download": b"\n"}, "empty files/r1"),
        ({}, "answered 404"),
    ],
)
def test_a_gemini_responses_file_that_is_empty_or_missing_is_a_provider_error(answers, said):
    operation = {
        "done": True,
        "metadata": {"state": "BATCH_STATE_SUCCEEDED"},
        "response": {"responsesFile": "files/r1"},
    }
    provider = answering(
        gemini.GeminiBatchProvider, {"/v1beta/batches/b1": operation, **answers}, "http://g.test/v1beta"
    )
    with pytest.raises(ProviderError, match=said):
        list(provider.results("batches/b1"))


@pytest.mark.parametrize("file_name", ["files/../batches/x", "https://elsewhere.test/files/r1", "r1"])
def test_a_gemini_responses_file_of_an_odd_name_is_never_asked_for(file_name):
    operation = {"done": True, "response": {"responsesFile": file_name}}
    asked = []
    provider = answering(
        gemini.GeminiBatchProvider, {"/v1beta/batches/b1": operation}, "http://g.test/v1beta"
    )
    provider.client.event_hooks["request"].append(asked.append)
    with pytest.raises(ProviderError, match="cannot ask for"):
        list(provider.results("batches/b1"))
    assert len(asked) == 1


@pytest.mark.parametrize("state", ["BATCH_STATE_EXPIRED", "BATCH_STATE_FAILED", "JOB_STATE_CANCELLED"])
def test_a_gemini_batch_that_ended_without_running_yields_nothing(state):
    provider = answering(
        gemini.GeminiBatchProvider,
        {"/batches/b1": {"done": True, "metadata": {"state": state}}},
        "http://g.test/v1beta",
    )
    assert list(provider.results("batches/b1")) == []


# 5. httpx errors that are not transport errors are ProviderErrors too (AnswerLost on a create).


def undecodable(request: httpx.Request) -> httpx.Response:
    """An answer whose body says gzip and is not: the provider answered, unreadably."""
    if request.url.path.endswith("/files"):
        return httpx.Response(200, json={"id": "file-1"})
    return httpx.Response(200, headers={"content-encoding": "gzip"}, stream=httpx.ByteStream(b"not gzip"))


def test_a_create_answered_with_a_body_that_cannot_be_decoded_is_a_lost_answer():
    client = httpx.Client(base_url="http://provider.test/v1", transport=httpx.MockTransport(undecodable))
    provider = openai.OpenAIBatchProvider(client=client)
    with pytest.raises(AnswerLost):
        provider.submit(requests=[request()], intent_key="k", metadata={})
    with pytest.raises(ProviderError) as raised:
        provider.status("b1")
    assert not isinstance(raised.value, AnswerLost)


def test_a_results_download_that_cannot_be_decoded_is_a_provider_error():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/batches/b1"):
            return httpx.Response(200, json={"id": "b1", "status": "completed", "output_file_id": "f1"})
        return undecodable(request)

    client = httpx.Client(base_url="http://provider.test/v1", transport=httpx.MockTransport(handler))
    with pytest.raises(ProviderError):
        list(openai.OpenAIBatchProvider(client=client).results("b1"))


def test_redirects_without_end_are_a_provider_error():
    def loop(request: httpx.Request) -> httpx.Response:
        return httpx.Response(302, headers={"location": str(request.url)})

    client = httpx.Client(
        base_url="http://provider.test/v1", transport=httpx.MockTransport(loop), follow_redirects=True
    )
    with pytest.raises(ProviderError):
        openai.OpenAIBatchProvider(client=client).status("b1")
    with pytest.raises(AnswerLost):
        anthropic.AnthropicBatchProvider(client=client).submit(
            requests=[request()], intent_key="k", metadata={}
        )


def test_a_reference_that_makes_no_url_is_a_provider_error_and_nothing_is_sent():
    from ledger.emulators.openai import Emulator

    with Emulator() as emulator:
        provider = openai.OpenAIBatchProvider(client=httpx.Client(base_url=emulator.base_url))
        with pytest.raises(ProviderError, match="could not be sent"):
            provider.status("b1\nb2")


# 6. Cloudflare: the finished poll answer is kept for `results`; the base `_call` is the one call.


def test_cloudflare_results_read_the_answer_the_finishing_poll_gave_without_asking_again():
    from ledger.emulators.cloudflare import CloudflareEmulator

    clock = TestClock()
    with CloudflareEmulator(per_request_ms=1, queued_ms=0, seed=3, clock=clock) as emulator:
        provider = cloudflare.CloudflareBatchProvider(
            client=httpx.Client(base_url=emulator.base_url, headers={"Authorization": "Bearer t"}),
            account_id="acct",
        )
        sent = [
            InferenceRequest(
                f"bd-{i}-1", "@cf/meta/llama-3.1-8b-instruct", "s", f"Title: spoon {i}", None, 50
            )
            for i in range(3)
        ]
        ref = provider.submit(requests=sent, intent_key="k", metadata={})
        clock.advance(seconds=1)
        assert provider.status(ref).ended
        # Were the responses given once only, asking again would find nothing: every poll fails now.
        emulator.configure(server_errors=100)

        lines = list(provider.results(ref))

        assert sorted(line.custom_id for line in lines) == [r.custom_id for r in sent]
        assert all(line.succeeded for line in lines)
        # Another adapter (no poll answer kept) does ask, and is told of the fault.
        other = cloudflare.CloudflareBatchProvider(
            client=httpx.Client(base_url=emulator.base_url), account_id="acct"
        )
        with pytest.raises(ProviderError):
            list(other.results(ref))


def test_cloudflare_calls_follow_the_base_rules():
    client = httpx.Client(base_url="http://cf.test/client/v4", transport=httpx.MockTransport(undecodable))
    provider = cloudflare.CloudflareBatchProvider(client=client, account_id="acct")
    model = "@cf/meta/llama-3.1-8b-instruct"
    with pytest.raises(AnswerLost):  # answered, unreadably: the unit may be queued
        provider.submit(
            requests=[InferenceRequest("bd-1-1", model, "s", "u", None, 5)], intent_key="k", metadata={}
        )
    with pytest.raises(ProviderError) as raised:
        provider.status(f"{model}|r1")
    assert not isinstance(raised.value, AnswerLost)
    with pytest.raises(ProviderError) as raised:  # never a ValueError from a call
        provider.submit(
            requests=[
                InferenceRequest("bd-1-1", "m1", "s", "u", None, 5),
                InferenceRequest("bd-2-1", "m2", "s", "u", None, 5),
            ],
            intent_key="k",
            metadata={},
        )
    assert not raised.value.transient


# 7. OpenAI: a refused download is told as every other refused call is.


def test_a_refused_openai_download_keeps_what_the_provider_said_and_its_retry_after():
    from ledger.emulators.openai import Emulator

    clock = TestClock()
    with Emulator(per_request_ms=0, clock=clock) as emulator:
        provider = openai.OpenAIBatchProvider(
            client=httpx.Client(
                base_url=emulator.base_url, headers={"Authorization": "Bearer sk-test-0123456789"}
            )
        )
        ref = provider.submit(requests=[request()], intent_key="k", metadata={})
        clock.advance(seconds=1)
        assert provider.status(ref).ended
        emulator.configure(rate_limit_calls=1, rate_limit_path="/v1/files/", retry_after=7)

        with pytest.raises(ProviderError) as raised:
            list(provider.results(ref))

        assert (raised.value.status, raised.value.retry_after, raised.value.transient) == (429, 7.0, True)
        assert "Rate limit reached" in str(raised.value) and "/content" in str(raised.value)


# 8. Anthropic: our key is never sent to a results_url elsewhere than the API.


def test_an_anthropic_results_url_at_another_host_is_never_followed():
    from ledger.emulators.anthropic import AnthropicEmulator

    clock = TestClock()
    with AnthropicEmulator(per_request_ms=0, clock=clock) as emulator:
        port = httpx.URL(emulator.base_url).port
        key = {"x-api-key": "sk-ant-test-0123456789", "anthropic-version": anthropic.API_VERSION}
        honest = anthropic.AnthropicBatchProvider(
            client=httpx.Client(base_url=emulator.base_url, headers=key)
        )
        ref = honest.submit(requests=[request()], intent_key="k", metadata={})
        clock.advance(seconds=1)
        assert honest.status(ref).ended
        assert [line.custom_id for line in honest.results(ref)] == ["bd-1-1"]

        # The emulator writes results_url from the Host it was asked under: here another host
        # (`localhost`, which would reach it, with our key) than the client's base URL.
        misled = anthropic.AnthropicBatchProvider(
            client=httpx.Client(base_url=emulator.base_url, headers={**key, "host": f"localhost:{port}"})
        )
        downloads = emulator.stats()["downloads"]
        with pytest.raises(ProviderError, match="not followed") as raised:
            list(misled.results(ref))
        assert not raised.value.transient
        assert emulator.stats()["downloads"] == downloads


@pytest.mark.parametrize(
    "results_url",
    ["https://api.test/v1/r", "http://api.test:8080/v1/r", "http://other.test/v1/r", "http://[::1"],
)
def test_an_anthropic_results_url_of_another_scheme_port_or_no_url_is_refused(results_url):
    batch = {"id": "b1", "processing_status": "ended", "results_url": results_url}
    provider = answering(anthropic.AnthropicBatchProvider, {"/batches/b1": batch}, "http://api.test")
    with pytest.raises(ProviderError, match="not followed|no URL") as raised:
        list(provider.results("b1"))
    assert not raised.value.transient


def test_an_anthropic_results_url_at_the_api_with_its_default_port_written_is_followed():
    line = json.dumps({"custom_id": "bd-1-1", "result": {"type": "expired"}})
    batch = {"id": "b1", "processing_status": "ended", "results_url": "HTTP://API.test:80/v1/b1/results"}
    provider = answering(
        anthropic.AnthropicBatchProvider,
        {"/batches/b1": batch, "/b1/results": line.encode()},
        "http://api.test",
    )
    assert [line.custom_id for line in provider.results("b1")] == ["bd-1-1"]


class RecordingGateway:
    """A second HTTP server, standing for a gateway in front of Anthropic's downloads: it notes
    every request it gets (path and key) and answers with one result line."""

    def __init__(self, line: bytes):
        gateway = self
        self.requests: list[tuple[str, str | None]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                gateway.requests.append((self.path, self.headers.get("x-api-key")))
                self.send_response(200)
                self.send_header("content-length", str(len(line)))
                self.end_headers()
                self.wfile.write(line)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "RecordingGateway":
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_an_anthropic_results_url_on_a_listed_gateway_host_is_followed_and_on_no_other(settings):
    from ledger.emulators.anthropic import AnthropicEmulator

    line = json.dumps({"custom_id": "bd-1-1", "result": {"type": "expired"}}).encode() + b"\n"
    key = "sk-ant-test-0123456789"
    clock = TestClock()
    with AnthropicEmulator(per_request_ms=0, clock=clock) as emulator, RecordingGateway(line) as gateway:
        deployed = {**settings.PROVIDERS["anthropic"], "base_url": emulator.base_url}
        setup = anthropic.AnthropicBatchProvider.from_settings(deployed)
        setup.client.headers["x-api-key"] = key
        ref = setup.submit(requests=[request()], intent_key="k", metadata={})
        clock.advance(seconds=1)
        assert setup.status(ref).ended

        def provider(results_hosts: str) -> anthropic.AnthropicBatchProvider:
            """Configured as a deployment is; the emulator writes results_url from the Host it is
            asked under, here the gateway's."""
            config = {**deployed, "results_hosts": results_hosts.split(",")}
            adapter = anthropic.AnthropicBatchProvider.from_settings(config)
            adapter.client.headers.update({"x-api-key": key, "host": f"localhost:{gateway.port}"})
            return adapter

        # By default only the API's own address; a listed host on another port is no permission.
        for unlisted in ["", f"localhost:{gateway.port + 1}", "localhost", "gateway.test"]:
            with pytest.raises(ProviderError, match="not followed") as raised:
                list(provider(unlisted).results(ref))
            assert "ANTHROPIC_RESULTS_HOSTS" in str(raised.value) and not raised.value.transient
        assert gateway.requests == []

        followed = list(provider(f"gateway.test, LOCALHOST:{gateway.port}").results(ref))

        assert [(line.custom_id, line.reason) for line in followed] == [("bd-1-1", ReasonCode.BATCH_EXPIRED)]
        assert gateway.requests == [(f"/v1/messages/batches/{ref}/results", key)]


# 9. Every batch adapter waits as long as a 429 asks, however the provider (or a gateway in front)
# says it (`ledger.retrying.requested_wait`).

BATCH_ADAPTERS = [
    openai.OpenAIBatchProvider,
    anthropic.AnthropicBatchProvider,
    cloudflare.CloudflareBatchProvider,
    gemini.GeminiBatchProvider,
]
# A unit's reference where an adapter reads more than an id from it.
UNIT_REFS = {
    cloudflare.CloudflareBatchProvider: "@cf/meta/llama|r-1",
    gemini.GeminiBatchProvider: "batches/b-1",
}


@pytest.mark.parametrize("provider_class", BATCH_ADAPTERS, ids=lambda cls: cls.name)
@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "7"}, 7.0),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"llm_provider-retry-after": "60"}, 60.0),
        ({"x-ratelimit-reset-requests": "6m0s", "x-ratelimit-remaining-requests": "0"}, 360.0),
        ({"retry-after": "31536000"}, 24 * 3600.0),
        ({"retry-after": "-3"}, None),
    ],
)
def test_a_429_is_waited_out_as_long_as_its_headers_ask_by_every_batch_adapter(
    provider_class, headers, seconds
):
    answer = {"error": {"message": "Rate limit reached", "type": "rate_limit_error"}}
    client = httpx.Client(
        base_url="http://provider.test/v1",
        transport=httpx.MockTransport(lambda request: httpx.Response(429, json=answer, headers=headers)),
    )
    extra = {"account_id": "acct"} if provider_class is cloudflare.CloudflareBatchProvider else {}
    provider = provider_class(client=client, **extra)

    with pytest.raises(ProviderError) as raised:
        provider.status(UNIT_REFS.get(provider_class, "b-1"))

    assert (raised.value.status, raised.value.transient, raised.value.retry_after) == (429, True, seconds)


def test_a_gemini_429_without_headers_waits_its_retry_delay():
    answer = {
        "error": {
            "code": 429,
            "status": "RESOURCE_EXHAUSTED",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"}],
        }
    }
    client = httpx.Client(
        base_url="http://provider.test/v1beta",
        transport=httpx.MockTransport(lambda request: httpx.Response(429, json=answer)),
    )

    with pytest.raises(ProviderError) as raised:
        gemini.GeminiBatchProvider(client=client).status("batches/b-1")

    assert raised.value.retry_after == 1.5
