"""A unit's input-file lines are written into a frame of what its requests share (`line_frame`): each
line is exactly what writing its whole request (`request_line`) gives, byte for byte, whatever its
texts, schema and limit hold, and a line the fast writer cannot write (a lone surrogate) is written as
before, with everything outside ASCII escaped."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.models import compact_json
from ledger.providers.base import InferenceRequest
from ledger.providers.openai import CUSTOM_ID_MARK, USER_MESSAGE_MARK, request_json, request_line

# Any text, lone surrogates and NUL included, and the frame's own stand-ins.
TEXT = st.one_of(
    st.text(st.characters(codec=None, exclude_categories=())),
    st.sampled_from([CUSTOM_ID_MARK, USER_MESSAGE_MARK, "é 中文 \U0001f600", 'quote " \\ \n', ""]),
)
SCHEMAS = st.sampled_from(
    [
        None,
        {},
        {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        {"type": "object", "properties": {"n": {"type": "number", "maximum": 1e16, "minimum": -0.5}}},
        {"type": "object", "properties": {"n": {"type": "integer", "maximum": 2**70}}},
        {"type": "object", "properties": {"é": {"type": "string", "description": "lone \ud800"}}},
        {"type": "object", "properties": {"x": {"type": "number", "minimum": float("nan")}}},
        {"type": "object", "properties": {"x": {"type": "string", "description": USER_MESSAGE_MARK}}},
    ]
)


def written_whole(request: InferenceRequest) -> bytes:
    return compact_json(request_line(request)).encode()


@settings(max_examples=600, deadline=None)
@given(
    custom_id=TEXT,
    model=st.one_of(TEXT, st.just("gpt-4o-mini")),
    system_message=TEXT,
    user_message=TEXT,
    schema=SCHEMAS,
    max_output_tokens=st.one_of(st.integers(min_value=0, max_value=2**65), st.booleans()),
)
def test_a_line_written_into_its_frame_is_the_whole_request_written(
    custom_id, model, system_message, user_message, schema, max_output_tokens
):
    request = InferenceRequest(
        custom_id=custom_id,
        model=model,
        system_message=system_message,
        user_message=user_message,
        output_schema=schema,
        max_output_tokens=max_output_tokens,
    )
    assert request_json(request) == written_whole(request)


def test_the_lines_of_one_unit_share_a_frame_and_keep_their_own_texts():
    shared = {
        "model": "gpt-4o-mini",
        "system_message": "You write product descriptions.",
        "output_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
        "max_output_tokens": 600,
    }
    first = InferenceRequest(custom_id="bd-1-0", user_message="Oak board", **shared)
    second = InferenceRequest(custom_id="bd-2-0", user_message="Lone \ud800 surrogate", **shared)
    assert json.loads(request_json(first))["body"]["messages"][1]["content"] == "Oak board"
    assert request_json(second) == written_whole(second)
    assert request_json(second).isascii()  # written whole, by the json module, as before
