"""Each provider's dialect of an output schema (SPEC rule 17): what it is sent, what is left to the
ledger's own check, and that the ledger still checks the whole schema."""

import copy
import json
import re

import httpx
import jsonschema
import pytest
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from ledger.actions.collecting import poll_submission
from ledger.actions.prompts import create_prompt_version
from ledger.actions.submitting import plan_submissions, send_submission
from ledger.bootstrap import DEFAULT_PROMPT
from ledger.drafts.schema_dialects import Dialect, LeftToLedger, sent_schema
from ledger.drafts.validation import DraftChecker
from ledger.models import Item, Submission
from ledger.providers.anthropic import batch_request
from ledger.providers.base import InferenceRequest
from ledger.providers.cloudflare import queued_request
from ledger.providers.gemini import inline_request
from ledger.providers.openai import OpenAIBatchProvider, request_line
from ledger.providers.openai_compatible import request_body
from ledger.states import ItemState, ReasonCode, SubmissionState
from tests.factories import JobFactory, ProductFactory

DEFAULT_SCHEMA = DEFAULT_PROMPT["output_schema"]

# --- an independent judge of OpenAI's strict subset (reference/providers.md §8.1) -----------------

STRICT_KEYWORDS = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "anyOf",
    "$ref",
    "$defs",
    "definitions",
    "description",
    "title",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minItems",
    "maxItems",
}
STRICT_FORMATS = {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}


def strict_problems(schema: dict) -> list[str]:
    """What OpenAI's strict mode would refuse in `schema`, as §8.1 states it; [] when nothing."""
    problems = []
    if schema.get("type") != "object":
        problems.append("the root is not an object")

    def walk(node: object, where: str) -> None:
        if not isinstance(node, dict):
            problems.append(f"{where}: a schema that is not an object")
            return
        for key in set(node) - STRICT_KEYWORDS:
            problems.append(f"{where}: {key} is not permitted")
        if "$ref" in node:
            if set(node) != {"$ref"}:
                problems.append(f"{where}: $ref beside other keywords")
            return
        if not ({"type", "anyOf"} & set(node)):
            problems.append(f"{where}: neither type nor anyOf")
        if "format" in node and node["format"] not in STRICT_FORMATS:
            problems.append(f"{where}: format {node['format']}")
        kinds = node.get("type")
        kinds = [kinds] if isinstance(kinds, str) else kinds or []
        if "object" in kinds:
            if node.get("additionalProperties") is not False:
                problems.append(f"{where}: an object not closed")
            if sorted(node.get("required", [])) != sorted(node.get("properties", {})):
                problems.append(f"{where}: not every property is required")
        if "array" in kinds and not isinstance(node.get("items"), dict):
            problems.append(f"{where}: an array without items")
        for name, sub in node.get("properties", {}).items():
            walk(sub, f"{where}/properties/{name}")
        for key in ("$defs", "definitions"):
            for name, sub in node.get(key, {}).items():
                walk(sub, f"{where}/{key}/{name}")
        for i, sub in enumerate(node.get("anyOf", [])):
            walk(sub, f"{where}/anyOf/{i}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{where}/items")

    walk(schema, "")
    return problems


# Schemas that reach every corner of the conversion: nested objects, arrays of objects, optional
# fields, definitions and references, unions, keywords strict mode refuses.
TRICKY_SCHEMAS = {
    "nested objects, some optional": {
        "type": "object",
        "properties": {
            "headline": {"type": "string", "minLength": 3, "maxLength": 120},
            "dimensions": {
                "type": "object",
                "properties": {
                    "width_cm": {"type": "number", "minimum": 0, "exclusiveMaximum": 1000},
                    "unit": {"enum": ["cm", "mm"]},
                    "note": {"type": "string", "default": ""},
                },
                "required": ["width_cm"],
            },
        },
        "required": ["headline"],
        "additionalProperties": False,
    },
    "arrays of objects": {
        "type": "object",
        "properties": {
            "bullets": {
                "type": "array",
                "minItems": 1,
                "maxItems": 5,
                "uniqueItems": True,
                "items": {
                    "type": "object",
                    "properties": {
                        "text": {"type": "string", "pattern": "^[A-Z]"},
                        "rank": {"type": "integer"},
                    },
                    "required": ["text", "rank"],
                    "additionalProperties": False,
                },
            },
            "tags": {
                "type": "array",
                "items": {"type": "string", "format": "hostname"},
                "contains": {"const": "x"},
            },
        },
        "required": ["bullets", "tags"],
    },
    "definitions and references": {
        "type": "object",
        "$defs": {
            "money": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number", "multipleOf": 0.01},
                    "currency": {"const": "GBP"},
                },
                "required": ["amount", "currency"],
            },
            "part": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "parts": {"type": "array", "items": {"$ref": "#/$defs/part"}},
                },
                "required": ["name"],
            },
        },
        "properties": {
            "price": {"$ref": "#/$defs/money"},
            "was": {"$ref": "#/$defs/money", "description": "the earlier price"},
            "assembly": {"$ref": "#/$defs/part"},
        },
        "required": ["price", "assembly"],
    },
    "unions and refused keywords": {
        "type": "object",
        "properties": {
            "size": {"anyOf": [{"type": "string", "maxLength": 10}, {"type": "integer", "minimum": 1}]},
            "colour": {"oneOf": [{"const": "red"}, {"const": "blue"}]},
            "extra": {"type": "object", "additionalProperties": {"type": "string"}},
            "mode": {"type": "string", "format": "color", "not": {"const": "off"}},
            "anything": {},
            "date": {"type": ["string", "null"], "format": "date"},
        },
        "required": ["size", "colour", "extra", "mode", "anything", "date"],
        "patternProperties": {"^x-": {"type": "string"}},
        "minProperties": 1,
        "if": {"required": ["size"]},
        "then": {"required": ["colour"]},
        "allOf": [{"required": ["mode"]}],
        "dependentRequired": {"size": ["colour"]},
        "propertyNames": {"maxLength": 20},
    },
    "a reference at the root": {
        "type": "object",
        "$ref": "#/$defs/named",
        "$defs": {
            "named": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
        },
        "properties": {"name": {"type": "string", "maxLength": 40}},
        "required": ["name"],
        "additionalProperties": False,
    },
}
ALL_SCHEMAS = {"the default prompt's": DEFAULT_SCHEMA, **TRICKY_SCHEMAS}


# --- the default prompt's schema, as each provider is sent it -------------------------------------


def test_openai_is_sent_the_default_schema_in_strict_mode_without_its_length_rules():
    sent = sent_schema(DEFAULT_SCHEMA, Dialect.OPENAI_STRICT)

    assert sent.schema == {
        "type": "object",
        "properties": {"headline": {"type": "string"}, "description": {"type": "string"}},
        "required": ["headline", "description"],
        "additionalProperties": False,
    }
    assert list(sent.schema["properties"]) == ["headline", "description"]  # the order a model writes in
    assert set(sent.left_to_ledger) == {
        LeftToLedger("minLength", "/properties/headline"),
        LeftToLedger("maxLength", "/properties/headline"),
        LeftToLedger("minLength", "/properties/description"),
        LeftToLedger("maxLength", "/properties/description"),
    }
    assert strict_problems(sent.schema) == []
    # The judge is not a rubber stamp: the schema as it is breaks the rules OpenAI refuses.
    assert sorted(strict_problems(DEFAULT_SCHEMA)) == sorted(
        f"/properties/{name}: {key} is not permitted"
        for name in ("headline", "description")
        for key in ("minLength", "maxLength")
    )


def test_gemini_is_sent_the_default_schema_without_its_length_rules():
    sent = sent_schema(DEFAULT_SCHEMA, Dialect.GEMINI)

    assert sent.schema == {
        "type": "object",
        "properties": {"headline": {"type": "string"}, "description": {"type": "string"}},
        "required": ["headline", "description"],
        "additionalProperties": False,
    }
    assert {(left.keyword, left.path) for left in sent.left_to_ledger} == {
        (key, f"/properties/{name}")
        for name in ("headline", "description")
        for key in ("minLength", "maxLength")
    }


def test_anthropic_and_cloudflare_are_sent_the_default_schema_as_it_is():
    sent = sent_schema(DEFAULT_SCHEMA, Dialect.AS_IS)
    assert sent.schema == DEFAULT_SCHEMA and sent.left_to_ledger == ()


def request(schema: dict = DEFAULT_SCHEMA) -> InferenceRequest:
    return InferenceRequest(
        custom_id="bd-1-1",
        model="m",
        system_message="You write product descriptions.",
        user_message="Title: Oak board",
        output_schema=schema,
        max_output_tokens=600,
    )


def test_each_adapter_puts_its_dialect_in_the_request():
    strict = sent_schema(DEFAULT_SCHEMA, Dialect.OPENAI_STRICT).schema

    assert request_line(request())["body"]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": strict, "strict": True},
    }
    assert request_body(request())["response_format"]["json_schema"] == {
        "name": "output",
        "schema": strict,
        "strict": True,
    }
    # A vLLM-style server (OPENAI_COMPATIBLE_SCHEMA=as_is) is sent the whole schema, not strict.
    assert request_body(request(), Dialect.AS_IS)["response_format"]["json_schema"] == {
        "name": "output",
        "schema": DEFAULT_SCHEMA,
    }
    assert inline_request(request())["request"]["generationConfig"]["responseJsonSchema"] == (
        sent_schema(DEFAULT_SCHEMA, Dialect.GEMINI).schema
    )
    assert batch_request(request())["params"]["tools"][0]["input_schema"] == DEFAULT_SCHEMA
    assert queued_request(request())["response_format"]["json_schema"] == DEFAULT_SCHEMA


def test_openai_compatible_reads_its_dialect_from_settings(settings):
    from ledger.providers import get_provider

    settings.PROVIDERS = {
        **settings.PROVIDERS,
        "openai_compatible": {**settings.PROVIDERS["openai_compatible"], "schema_dialect": "as_is"},
    }
    assert get_provider("openai_compatible").schema_dialect == Dialect.AS_IS
    settings.PROVIDERS["openai_compatible"]["schema_dialect"] = "openai_strict"
    assert get_provider("openai_compatible").schema_dialect == Dialect.OPENAI_STRICT


def test_a_schema_is_converted_once_however_many_requests_carry_it():
    first = sent_schema(copy.deepcopy(DEFAULT_SCHEMA), Dialect.OPENAI_STRICT)
    assert sent_schema(copy.deepcopy(DEFAULT_SCHEMA), Dialect.OPENAI_STRICT) is first
    # Keyed by content, order included: `true` and `1` are not the same schema.
    assert sent_schema({"type": "object", "properties": {"a": {"const": True}}}, Dialect.OPENAI_STRICT) != (
        sent_schema({"type": "object", "properties": {"a": {"const": 1}}}, Dialect.OPENAI_STRICT)
    )


# --- property-style: every tricky schema ----------------------------------------------------------


def keywords(schema: object, path: str = "") -> set[tuple[str, str]]:
    """(JSON Pointer, keyword) of every keyword at a schema position."""
    found: set[tuple[str, str]] = set()
    if not isinstance(schema, dict):
        return found
    for key, value in schema.items():
        found.add((path, key))
        if key in ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas"):
            for name, sub in value.items():
                found |= keywords(sub, f"{path}/{key}/{name}")
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems") and isinstance(value, list):
            for i, sub in enumerate(value):
                found |= keywords(sub, f"{path}/{key}/{i}")
        elif key in (
            "items",
            "additionalProperties",
            "not",
            "if",
            "then",
            "else",
            "contains",
            "propertyNames",
        ):
            found |= keywords(value, f"{path}/{key}")
    return found


def walk_to(schema: dict, path: str) -> object:
    node: object = schema
    for part in [p for p in path.split("/") if p]:
        if isinstance(node, dict) and part == "oneOf" and "oneOf" not in node:
            part = "anyOf"
        if isinstance(node, dict) and part not in node and isinstance(node.get("anyOf"), list):
            node = node["anyOf"][0]  # the optional property's `anyOf: [it, null]`
        node = (
            node[int(part)] if isinstance(node, list) else node.get(part) if isinstance(node, dict) else None
        )
    return node


@pytest.mark.parametrize("name", ALL_SCHEMAS)
def test_the_strict_dialect_of_every_schema_keeps_openais_rules_and_loses_nothing_silently(name):
    schema = ALL_SCHEMAS[name]
    sent = sent_schema(schema, Dialect.OPENAI_STRICT)
    left = {(item.path, item.keyword) for item in sent.left_to_ledger}

    assert strict_problems(sent.schema) == [], name
    jsonschema.Draft202012Validator.check_schema(sent.schema)
    # Every reference of the sent schema points at something inside it.
    resolver = (
        Registry().with_resource("urn:sent", DRAFT202012.create_resource(sent.schema)).resolver("urn:sent")
    )
    for ref in refs(sent.schema):
        resolver.lookup(ref)
    # Each keyword of the prompt's schema is sent where it stood, or listed as left to the ledger.
    rebuilt = {"type", "properties", "required", "additionalProperties", "items", "const", "oneOf", "anyOf"}
    containers = {"$defs", "definitions"}  # their schemas are looked at one by one
    for path, key in keywords(schema):
        inside_left = any(path.startswith(f"{p}/{k}") for p, k in left)
        if (path, key) in left or inside_left or key in rebuilt | containers:
            continue
        node = walk_to(sent.schema, path)
        if isinstance(node, dict) and key not in node and {"type": "null"} in node.get("anyOf", []):
            node = node["anyOf"][0]  # an optional property's `anyOf: [it, null]`
        assert isinstance(node, dict), (name, path, key)
        sent_value = node.get(key)
        if key == "enum":  # an optional property's enum also takes null
            sent_value = [value for value in sent_value if value is not None]
        assert sent_value == walk_to(schema, path)[key], (name, path, key)
    # A schema's own input is never changed.
    assert schema == ALL_SCHEMAS[name]


def refs(schema: object) -> list[str]:
    if isinstance(schema, dict):
        own = [schema["$ref"]] if "$ref" in schema else []
        return own + [r for v in schema.values() for r in refs(v)]
    if isinstance(schema, list):
        return [r for v in schema for r in refs(v)]
    return []


@pytest.mark.parametrize("name", TRICKY_SCHEMAS)
def test_the_strict_dialect_accepts_every_complete_answer_the_schema_accepts(name):
    """An answer to the strict schema has every key; one the prompt's schema accepts with every key
    present (and nothing outside its properties) is one strict mode could have produced."""
    schema = TRICKY_SCHEMAS[name]
    sent = sent_schema(schema, Dialect.OPENAI_STRICT).schema
    for answer in COMPLETE_ANSWERS[name]:
        assert jsonschema.Draft202012Validator(schema).is_valid(answer), answer
        assert jsonschema.Draft202012Validator(sent).is_valid(answer), answer


COMPLETE_ANSWERS = {
    "nested objects, some optional": [
        {"headline": "Oak board", "dimensions": {"width_cm": 30, "unit": "cm", "note": "oiled"}},
        {"headline": "Oak", "dimensions": {"width_cm": 0, "unit": "mm", "note": ""}},
    ],
    "arrays of objects": [
        {"bullets": [{"text": "Solid oak", "rank": 1}], "tags": ["x", "example.com"]},
    ],
    "definitions and references": [
        {
            "price": {"amount": 12.5, "currency": "GBP"},
            "was": {"amount": 15, "currency": "GBP"},
            "assembly": {"name": "board", "parts": [{"name": "leg", "parts": []}]},
        },
    ],
    "a reference at the root": [{"name": "Oak board"}],
    "unions and refused keywords": [
        {"size": 3, "colour": "red", "extra": {}, "mode": "on", "anything": "x", "date": "2026-12-02"},
        {"size": "large", "colour": "blue", "extra": {}, "mode": "on", "anything": None, "date": None},
    ],
}


@pytest.mark.parametrize("name", ALL_SCHEMAS)
def test_the_gemini_dialect_sends_no_length_rule_and_only_its_subset(name):
    sent = sent_schema(ALL_SCHEMAS[name], Dialect.GEMINI)
    gemini_keywords = {
        "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
        "maxItems", "enum", "format", "minimum", "maximum", "anyOf", "$ref", "$defs", "definitions",
        "title", "description", "propertyOrdering",
    }  # fmt: skip
    used = {key for _, key in keywords(sent.schema)}
    assert used <= gemini_keywords, used - gemini_keywords
    assert not {"minLength", "maxLength"} & used
    left = {item.keyword for item in sent.left_to_ledger}
    original = {key for _, key in keywords(ALL_SCHEMAS[name])}
    assert original - gemini_keywords - {"const", "oneOf"} <= left


# --- the ledger still checks the whole schema -----------------------------------------------------


def test_a_draft_breaking_a_length_rule_openai_was_not_sent_is_still_unusable():
    assert "maxLength" not in json.dumps(sent_schema(DEFAULT_SCHEMA, Dialect.OPENAI_STRICT).schema)
    checker = DraftChecker(DEFAULT_SCHEMA, DEFAULT_PROMPT["rules"])

    checked = checker.check(json.dumps({"headline": "H" * 121, "description": "A solid oak board. " * 5}))

    assert [reason.code for reason in checked.reasons] == [ReasonCode.TOO_LONG]
    assert checked.reasons == ["Too long: headline is 121 characters, the limit is 120"]


# --- the OpenAI emulator refusing what OpenAI refuses ----------------------------------------------


def test_openai_strict_mode_takes_every_schema_the_adapter_sends(clock, emulator):
    """The emulator, made to refuse strict schemas outside OpenAI's subset as OpenAI does, runs
    every request the adapter sends, for the default prompt's schema and every tricky one."""
    emulator.configure(strict_schemas=True)
    sent = [
        InferenceRequest(
            custom_id=f"bd-{i}-1",
            model="gpt-4o-mini",
            system_message="You write product descriptions.",
            user_message="Title: Oak board",
            output_schema=schema,
            max_output_tokens=300,
        )
        for i, schema in enumerate(ALL_SCHEMAS.values())
    ]
    with httpx.Client(
        base_url=emulator.base_url, headers={"Authorization": "Bearer k"}, timeout=10
    ) as client:
        provider = OpenAIBatchProvider(client=client)
        ref = provider.submit(requests=sent, intent_key="bd_intent_dialects", metadata={})
        for _ in range(200):
            status = provider.status(ref)
            if status.ended:
                break
            clock.advance(ms=50)
        lines = list(provider.results(ref))

    refused = [line for line in lines if line.http_status == 400]
    assert refused == [] and len(lines) == len(sent)
    assert set(emulator.stats()["inferences"]) == {r.custom_id for r in sent}


@pytest.mark.django_db
def test_through_the_pipeline_a_length_rule_openai_was_not_sent_still_fails_the_draft(
    clock, emulator, provider
):
    """The emulator refuses strict schemas outside OpenAI's subset (as OpenAI does), so the
    version's maxLength is not sent; its drafts come back and the ledger's own check refuses them."""
    schema = copy.deepcopy(DEFAULT_SCHEMA)
    schema["properties"]["headline"]["maxLength"] = 5  # shorter than any headline the emulator writes
    prompt = create_prompt_version(
        task="short_headlines",
        system_message=DEFAULT_PROMPT["system_message"],
        template=DEFAULT_PROMPT["template"],
        output_schema=schema,
        rules={"text_field": "description"},
        max_output_tokens=300,
    )
    job = JobFactory(task="short_headlines", prompt_version=prompt)
    for _ in range(3):
        product = ProductFactory()
        Item.objects.create(job=job, product=product, source_revision=product.current_revision)
    [submission_id] = plan_submissions(job.pk)
    send_submission(submission_id, provider=provider)
    for _ in range(200):
        poll_submission(submission_id, provider=provider)
        if Submission.objects.get(pk=submission_id).state == SubmissionState.COLLECTED:
            break
        clock.advance(ms=50)

    items = list(Item.objects.filter(job=job))
    assert {item.state for item in items} == {ItemState.VALIDATION_FAILED}
    for item in items:
        assert item.reason_code == ReasonCode.TOO_LONG
        assert re.fullmatch(r"Too long: headline is \d+ characters, the limit is 5", item.reason), item.reason
