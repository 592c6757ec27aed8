"""The emulators keep results and files only as long as their providers do (reference/providers.md
§8.3), on their clock: OpenAI's files until their `expires_at` (an output file 30 days after its
batch ended), Gemini's files 48 hours, Anthropic's results 29 days from the batch's creation. Asked
through the official SDKs."""

import io

import anthropic
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from ledger.emulators.anthropic import AnthropicEmulator
from ledger.emulators.gemini import GeminiEmulator

DAY = 86400


def test_an_openai_output_file_is_deleted_when_it_expires(emulator, clock):
    with openai.OpenAI(base_url=emulator.base_url, api_key="sk-test", max_retries=0) as sdk:
        line = b'{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"Title: Lamp"}]}}\n'
        uploaded = sdk.files.create(file=("in.jsonl", line), purpose="batch")
        batch = sdk.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        clock.advance(seconds=5)
        batch = sdk.batches.retrieve(batch.id)
        assert batch.status == "completed"
        output = sdk.files.retrieve(batch.output_file_id)
        assert output.expires_at == output.created_at + 30 * DAY

        clock.advance(seconds=output.expires_at - clock.now() - 1)
        assert sdk.files.content(batch.output_file_id).content
        clock.advance(seconds=1)

        with pytest.raises(openai.NotFoundError):
            sdk.files.content(batch.output_file_id)
        assert batch.output_file_id not in {file.id for file in sdk.files.list()}


def test_a_gemini_file_is_deleted_after_48_hours(clock):
    with GeminiEmulator(clock=clock) as emulator:
        root = emulator.base_url.removesuffix("/v1beta")
        sdk = genai.Client(api_key="k", http_options=types.HttpOptions(base_url=root, api_version="v1beta"))
        line = b'{"key":"a","request":{"contents":[{"parts":[{"text":"Title: Lamp"}]}]}}\n'
        uploaded = sdk.files.upload(
            file=io.BytesIO(line),
            config=types.UploadFileConfig(mime_type="application/jsonl"),
        )
        clock.advance(seconds=48 * 3600 - 1)
        assert sdk.files.get(name=uploaded.name).name == uploaded.name
        clock.advance(seconds=1)

        with pytest.raises(genai_errors.ClientError):
            sdk.files.get(name=uploaded.name)
        assert uploaded.name not in {file.name for file in sdk.files.list()}


def test_anthropic_results_are_gone_29_days_after_the_batch_was_created(clock):
    with AnthropicEmulator(clock=clock, per_request_ms=1) as emulator:
        sdk = anthropic.Anthropic(base_url=emulator.base_url, api_key="sk-ant-test", max_retries=0)
        batch = sdk.messages.batches.create(
            requests=[
                {
                    "custom_id": "a",
                    "params": {
                        "model": "claude-haiku-4-5",
                        "max_tokens": 100,
                        "messages": [{"role": "user", "content": "Title: Lamp"}],
                    },
                }
            ]
        )
        clock.advance(seconds=5)
        assert [result.custom_id for result in sdk.messages.batches.results(batch.id)] == ["a"]
        clock.advance(seconds=29 * DAY - 5)

        with pytest.raises(anthropic.NotFoundError):
            list(sdk.messages.batches.results(batch.id))
