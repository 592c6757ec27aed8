"""The official `openai` SDK's chat completions against the compatible-server emulator: what a
vLLM / llama.cpp / Ollama client sees, the emulator must answer the same way."""

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel

from ledger.emulators.openai_compatible import CompatibleServerEmulator

SCHEMA = {
    "type": "object",
    "properties": {"headline": {"type": "string"}, "description": {"type": "string"}},
    "required": ["headline", "description"],
    "additionalProperties": False,
}
MESSAGES = [
    {"role": "system", "content": "You write product descriptions."},
    {"role": "user", "content": "Title: Walnut chopping board\n- wood: walnut\n- length: 40 cm"},
]


class Draft(BaseModel):
    headline: str
    description: str


@pytest.fixture
def emulator():
    with CompatibleServerEmulator(per_request_ms=5, seed=1) as running:
        yield running


@pytest.fixture
def client(emulator):
    with openai.OpenAI(base_url=emulator.base_url, api_key="local", max_retries=2) as client:
        yield client


def test_chat_completion_with_a_json_schema_response_format(emulator, client):
    completion = client.chat.completions.create(
        model="llama-3.1-8b",
        messages=MESSAGES,
        max_completion_tokens=300,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": SCHEMA, "strict": True},
        },
        extra_headers={"X-Request-Id": "bd-1-1"},
    )

    choice = completion.choices[0]
    assert choice.finish_reason == "stop" and choice.message.role == "assistant"
    draft = json.loads(choice.message.content)
    jsonschema.validate(draft, SCHEMA)
    assert "Walnut" in draft["headline"]
    assert (
        completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    )
    assert emulator.stats()["inferences"] == {"bd-1-1": 1}


def test_parse_into_a_pydantic_model(client):
    completion = client.chat.completions.parse(model="llama-3.1-8b", messages=MESSAGES, response_format=Draft)

    assert isinstance(completion.choices[0].message.parsed, Draft)


def test_models_are_listed(client):
    assert "emulated-model" in {model.id for model in client.models.list()}


def test_the_sdk_waits_out_a_429_and_succeeds(emulator, client):
    emulator.configure(rate_limit_calls=2, retry_after=0.1)

    completion = client.chat.completions.create(model="llama-3.1-8b", messages=MESSAGES)

    assert completion.choices[0].message.content
    assert emulator.stats()["rejected_calls"] == 2


def test_errors_arrive_as_the_sdks_typed_exceptions(emulator, client):
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="", messages=MESSAGES)
    assert bad.value.param == "model"

    emulator.configure(api_key="other")
    with pytest.raises(openai.AuthenticationError) as refused:
        client.chat.completions.create(model="llama-3.1-8b", messages=MESSAGES)
    assert refused.value.code == "invalid_api_key"
