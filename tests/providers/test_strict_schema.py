"""The emulators' judge of OpenAI's strict Structured Outputs subset (providers.md §8.1): what it
refuses, where, in OpenAI's words; and what it takes."""

import copy

import pytest

from ledger.bootstrap import DEFAULT_PROMPT
from ledger.drafts.schema_dialects import Dialect, sent_schema
from ledger.emulators import strict_schema

CLOSED = {
    "type": "object",
    "properties": {"headline": {"type": "string"}, "description": {"type": "string"}},
    "required": ["headline", "description"],
    "additionalProperties": False,
}
REFUSED_KEYWORDS = {
    "minLength": 3,
    "maxLength": 30,
    "uniqueItems": True,
    "default": "x",
    "patternProperties": {"^a": {"type": "string"}},
    "propertyNames": {"pattern": "^a"},
    "minProperties": 1,
    "maxProperties": 2,
    "not": {"type": "null"},
    "if": {"type": "string"},
    "then": {"type": "string"},
    "else": {"type": "string"},
    "allOf": [{"type": "string"}],
    "oneOf": [{"type": "string"}],
    "contains": {"type": "string"},
    "dependentRequired": {"a": ["b"]},
}


def strict(schema: object, name: str = "output") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def with_headline(**keywords: object) -> dict:
    schema = copy.deepcopy(CLOSED)
    schema["properties"]["headline"].update(keywords)
    return schema


def test_the_default_prompts_schema_is_refused_as_openai_refuses_it():
    assert strict_schema.refusal(strict(DEFAULT_PROMPT["output_schema"])) == (
        "Invalid schema for response_format 'output': In context=('properties', 'headline'), "
        "'minLength' is not permitted."
    )


@pytest.mark.parametrize(("keyword", "value"), REFUSED_KEYWORDS.items())
def test_each_keyword_outside_the_subset_is_not_permitted(keyword, value):
    assert strict_schema.schema_problem(with_headline(**{keyword: value})) == (
        f"In context=('properties', 'headline'), '{keyword}' is not permitted."
    )


def test_what_the_subset_takes_is_accepted():
    schema = {
        "type": "object",
        "title": "Draft",
        "description": "A product description.",
        "properties": {
            "headline": {"type": "string", "pattern": "^[A-Z]", "description": "short"},
            "sku": {"type": ["string", "null"], "format": "uuid"},
            "price": {"type": "number", "minimum": 0, "exclusiveMaximum": 10_000, "multipleOf": 0.01},
            "rating": {"type": "integer", "maximum": 5, "exclusiveMinimum": 0},
            "tone": {"type": "string", "enum": ["plain", "warm"]},
            "bullets": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 5},
            "size": {"anyOf": [{"$ref": "#/$defs/size"}, {"type": "null"}]},
        },
        "required": ["headline", "sku", "price", "rating", "tone", "bullets", "size"],
        "additionalProperties": False,
        "$defs": {
            "size": {
                "type": "object",
                "properties": {"cm": {"type": "number"}},
                "required": ["cm"],
                "additionalProperties": False,
            }
        },
    }

    assert strict_schema.refusal(strict(schema)) is None


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        (
            {**CLOSED, "additionalProperties": True},
            "In context=(), 'additionalProperties' is required to be supplied and to be false.",
        ),
        (
            {key: value for key, value in CLOSED.items() if key != "additionalProperties"},
            "In context=(), 'additionalProperties' is required to be supplied and to be false.",
        ),
        (
            {**CLOSED, "required": ["headline"]},
            "In context=(), 'required' is required to be supplied and to be an array including every "
            "key in properties. Missing 'description'.",
        ),
        (
            with_headline(type="object", properties={"x": {"type": "string"}}, required=["x"]),
            "In context=('properties', 'headline'), 'additionalProperties' is required to be supplied "
            "and to be false.",
        ),
        (
            with_headline(type="array", items={"type": "string", "maxLength": 5}),
            "In context=('properties', 'headline', 'items'), 'maxLength' is not permitted.",
        ),
        (with_headline(type="array"), "In context=('properties', 'headline'), array schema missing items."),
        (
            {
                **CLOSED,
                "properties": {
                    **CLOSED["properties"],
                    "headline": {"anyOf": [{"type": "null"}, {"type": "string", "default": ""}]},
                },
            },
            "In context=('properties', 'headline', 'anyOf', '1'), 'default' is not permitted.",
        ),
        (
            {**CLOSED, "$defs": {"note": {"type": "string", "uniqueItems": True}}},
            "In context=('$defs', 'note'), 'uniqueItems' is not permitted.",
        ),
        (with_headline(format="uri"), "In context=('properties', 'headline'), 'uri' is not a valid format."),
        (
            {**CLOSED, "properties": {**CLOSED["properties"], "headline": {"description": "any"}}},
            "In context=('properties', 'headline'), schema must have a 'type' key.",
        ),
        (
            {**CLOSED, "properties": {**CLOSED["properties"], "headline": {"$ref": "http://x.test/s"}}},
            "In context=('properties', 'headline'), '$ref' must point inside the schema ('#/...').",
        ),
        (
            {
                **CLOSED,
                "properties": {**CLOSED["properties"], "headline": {"$ref": "#/$defs/a", "title": "t"}},
            },
            "In context=('properties', 'headline'), $ref cannot have keywords {'title'}.",
        ),
        (
            {"type": "array", "items": {"type": "string"}},
            "schema must be a JSON Schema of 'type: \"object\"', got 'type: \"array\"'.",
        ),
        ({"anyOf": [CLOSED]}, "schema must be a JSON Schema of 'type: \"object\"', got 'type: \"None\"'."),
    ],
)
def test_structure_outside_the_subset_is_named_where_it_is(schema, problem):
    assert strict_schema.schema_problem(schema) == problem


def test_only_a_strict_json_schema_is_judged():
    loose = {"type": "json_schema", "json_schema": {"name": "output", "schema": with_headline(minLength=1)}}

    assert strict_schema.refusal(loose) is None
    assert strict_schema.refusal({"type": "json_object"}) is None
    assert strict_schema.refusal(None) is None
    assert strict_schema.refusal(strict(with_headline(minLength=1), name="draft")).startswith(
        "Invalid schema for response_format 'draft': "
    )


# Schemas a catalogue owner may write, each leaving OpenAI's subset in its own way.
WRITTEN_SCHEMAS = [
    DEFAULT_PROMPT["output_schema"],
    {"type": "object", "properties": {"headline": {"type": "string", "maxLength": 80}}},
    {
        "type": "object",
        "properties": {
            "bullets": {"type": "array", "items": {"type": "string", "minLength": 2}, "uniqueItems": True},
            "specs": {
                "type": "object",
                "properties": {"weight": {"type": "number", "default": 0}, "unit": {"const": "kg"}},
                "required": ["weight"],
            },
            "tone": {"oneOf": [{"type": "string", "enum": ["plain"]}, {"type": "null"}]},
            "link": {"type": "string", "format": "uri"},
            "anything": True,
            "untyped": {"description": "no type at all"},
            "extras": {"type": "object", "patternProperties": {"^x-": {"type": "string"}}},
        },
        "required": ["bullets"],
        "additionalProperties": True,
    },
    {
        "type": "object",
        "properties": {"size": {"$ref": "#/$defs/size", "description": "beside the reference"}},
        "$defs": {"size": {"type": "object", "properties": {"cm": {"type": "integer", "minimum": 1}}}},
        "allOf": [{"required": ["size"]}],
    },
    {
        "type": "object",
        "properties": {"parts": {"type": "array", "items": {"$ref": "#/definitions/part"}, "minItems": 1}},
        "definitions": {
            "part": {"type": "object", "properties": {"name": {"type": "string"}}, "dependentRequired": {}}
        },
    },
]


@pytest.mark.parametrize("schema", WRITTEN_SCHEMAS)
def test_what_the_openai_adapter_sends_stays_inside_the_subset(schema):
    assert strict_schema.schema_problem(schema) is not None  # as written, OpenAI refuses it

    sent = sent_schema(schema, Dialect.OPENAI_STRICT).schema

    assert strict_schema.schema_problem(sent) is None
