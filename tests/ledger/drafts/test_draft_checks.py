"""Drafts are checked by a `DraftChecker` prepared once per prompt version. Its own check of a plain
schema only ever passes what jsonschema passes (jsonschema judges and words every refusal)."""

import jsonschema
import pytest

from ledger.bootstrap import DEFAULT_PROMPT
from ledger.drafts.validation import DraftChecker, check_draft, plain_schema_check
from ledger.models import PromptVersion, SourceRevision

SCHEMAS = [
    DEFAULT_PROMPT["output_schema"],
    {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 5},
            "details": {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}, "gone": {"type": "null"}},
                "required": ["ok"],
            },
        },
    },
]
VALUES = [
    {"headline": "Oak board", "description": "x" * 40},
    {"headline": "Oak board", "description": "x" * 39},
    {"headline": "Oak board", "description": "é" * 40},
    {"headline": "Oak board", "description": "x" * 1201},
    {"headline": "Oak board"},
    {"headline": "Oak board", "description": "x" * 40, "extra": 1},
    {"headline": 3, "description": "x" * 40},
    {"headline": None, "description": "x" * 40},
    {"headline": ["Oak"], "description": "x" * 40},
    {"title": "short", "details": {"ok": True}},
    {"title": "too long", "details": {"ok": True}},
    {"title": "ab", "details": {"ok": 1}},
    {"title": "ab", "details": {"ok": False, "gone": None, "more": [1]}},
    {"title": "ab", "details": {"gone": None}},
    {"title": "ab", "details": []},
    [],
    "a string",
    None,
    12,
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=["default prompt", "nested"])
@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_a_plain_schema_passes_exactly_what_jsonschema_passes(schema, value):
    passes = plain_schema_check(schema)

    assert passes is not None
    assert passes(value) == jsonschema.validators.validator_for(schema)(schema).is_valid(value)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"n": {"type": "integer"}}},
        {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a"}}},
        {"type": "object", "additionalProperties": {"type": "string"}},
        {"type": "array", "items": {"type": "string"}},
        {"properties": {"s": {"type": "string"}}},
        {"type": ["string", "null"]},
        {"type": "object", "$ref": "#/definitions/x"},
    ],
)
def test_any_other_schema_is_left_to_jsonschema(schema):
    assert plain_schema_check(schema) is None


def test_the_checker_says_which_rule_the_draft_broke_and_where():
    prompt = PromptVersion(**DEFAULT_PROMPT)
    revision = SourceRevision(title="Oak board", fields={})

    reasons = check_draft(
        prompt=prompt, revision=revision, output='{"headline": "Oak board", "description": 4}'
    ).reasons

    assert reasons == ["Does not match the output schema at description: must be a string (got 4)"]
    assert DraftChecker.of(prompt) is DraftChecker.of(PromptVersion(**DEFAULT_PROMPT))


FENCE_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


@pytest.mark.parametrize(
    "answer",
    [
        '```json\n{"text": "Oak board"}\n```',
        '\n  ```JSON\r\n{"text": "Oak board"}\r\n```  \n',
        '```\n{"text": "Oak board"}\n```\n',
    ],
    ids=["labelled", "crlf and whitespace", "bare"],
)
def test_json_that_is_one_code_block_is_read_without_its_fence_and_noted(answer):
    checked = DraftChecker(FENCE_SCHEMA, {}).check(answer)

    assert (checked.text, checked.reasons, checked.notes) == (
        '{"text": "Oak board"}',
        [],
        ["read_from_code_fence"],
    )
    assert DraftChecker(FENCE_SCHEMA, {"text_field": "text"}).check(answer).text == "Oak board"


@pytest.mark.parametrize(
    "answer",
    [
        'Here it is:\n```json\n{"text": "Oak board"}\n```',
        '```json\n{"text": "Oak"}\n```\n```json\n{"text": "Ash"}\n```',
        '```python\n{"text": "Oak board"}\n```',
        '```json\n{"text": "Oak board"\n```',
        '```json {"text": "Oak board"} ```',
    ],
    ids=["prose beside it", "two blocks", "another language", "not JSON inside", "one line"],
)
def test_anything_more_than_one_fenced_json_block_is_not_json(answer):
    checked = DraftChecker(FENCE_SCHEMA, {}).check(answer)

    assert [reason.code for reason in checked.reasons] == ["not_json"]
    assert (checked.text, checked.notes) == (answer, [])


def test_a_draft_cut_off_is_truncated_even_when_what_came_reads_as_valid():
    checked = DraftChecker(FENCE_SCHEMA, {}).check('{"text": "Oak board"}', truncated=True)

    assert [reason.code for reason in checked.reasons] == ["truncated"]
