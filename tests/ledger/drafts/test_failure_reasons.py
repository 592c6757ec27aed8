"""A failure reason says what failed (SPEC rule 19), its cause first: a text too long or too short
with its length and the limit, why an answer is not JSON, which property broke which rule of the
schema, an unstated claim with its words. A reason quotes the draft only after its cause, cut
short: a 20,000-character draft never pushes the cause out of its reason."""

import json

import pytest

from ledger.actions.reviewing import edit_reasons
from ledger.drafts.validation import DraftChecker
from ledger.models import PromptVersion, SourceRevision
from ledger.states import ReasonCode

LONG = 20_000
# What a reason holds at most, its quote included: never a draft.
REASON_CHARS = 400

SCHEMA = {
    "type": "object",
    "properties": {
        "headline": {"type": "string", "minLength": 3, "maxLength": 120},
        "description": {"type": "string", "minLength": 40, "maxLength": 1200},
        "tone": {"enum": ["warm", "plain"]},
        "notes": {"type": "string"},
        "bullets": {"type": "array", "items": {"type": "string", "pattern": "^[A-Z]"}, "maxItems": 5},
        "width_cm": {"type": "number", "minimum": 0},
    },
    "required": ["headline", "description"],
    "additionalProperties": False,
}
CLAIMS = {"claim_words": ["waterproof"]}
FINE = {"headline": "Oak board", "description": "A solid oak chopping board that is oiled by hand."}
SOURCE = "oak chopping board\nmaterial\noak"


def one_reason(answer: object, rules: dict | None = None, schema: dict = SCHEMA):
    """The one reason `DraftChecker` gives for a draft (a JSON answer, or a text as it is)."""
    checker = DraftChecker(schema, rules or {})
    draft = answer if isinstance(answer, str) else json.dumps(answer)
    checked = checker.check(draft)
    reasons = checked.reasons + checker.unstated(checked.claimed, checked.text, SOURCE)
    assert len(reasons) == 1, reasons
    assert len(reasons[0]) <= REASON_CHARS, reasons[0]
    return reasons[0]


def test_a_property_too_long_for_its_schema_is_too_long_with_its_length_and_the_limit():
    reason = one_reason({**FINE, "description": "x" * LONG})

    assert (reason.code, reason) == (
        ReasonCode.TOO_LONG,
        "Too long: description is 20,000 characters, the limit is 1,200",
    )


def test_a_text_too_long_for_the_rules_is_too_long_with_its_length_and_the_limit():
    schema = {"type": "object", "properties": {"description": {"type": "string"}}}
    reason = one_reason({"description": "x" * LONG}, {"text_field": "description", "max_length": 600}, schema)
    assert (reason.code, reason) == (
        ReasonCode.TOO_LONG,
        "Too long: description is 20,000 characters, the limit is 600",
    )

    reason = one_reason("x" * LONG, {"max_length": 600}, {})
    assert (reason.code, reason) == (
        ReasonCode.TOO_LONG,
        "Too long: the draft is 20,000 characters, the limit is 600",
    )


def test_a_text_too_short_is_too_short_with_its_length_and_the_minimum_beside_a_long_draft():
    reason = one_reason({**FINE, "description": "Oak.", "notes": "n" * LONG})
    assert (reason.code, reason) == (
        ReasonCode.TOO_SHORT,
        "Too short: description is 4 characters, the minimum is 40",
    )

    reason = one_reason("Oak.", {"min_length": 40}, {})
    assert (reason.code, reason) == (
        ReasonCode.TOO_SHORT,
        "Too short: the draft is 4 characters, the minimum is 40",
    )


@pytest.mark.parametrize(
    "draft, cause",
    [
        ("Introducing the oak board. " * 741, "Expecting value (line 1, column 1)"),
        (
            json.dumps({**FINE, "notes": "n" * LONG})[:LONG],
            "Unterminated string starting at (line 1, column ",
        ),
        ("```json\n" + json.dumps({**FINE, "notes": "n" * LONG})[:LONG] + "\n```", "Unterminated string"),
    ],
    ids=["prose", "cut off", "a fence around broken JSON"],
)
def test_a_draft_that_is_not_json_says_where_the_reading_failed_then_how_it_begins(draft, cause):
    reason = one_reason(draft)

    assert reason.code == ReasonCode.NOT_JSON
    assert reason.startswith(f"Not the JSON the prompt asked for: {cause}")
    assert reason.endswith(f"…” ({len(draft):,} characters)")
    assert f"the draft reads “{draft[:80]}…”" in reason


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            {"tone": "t" * LONG},
            "at tone: must be one of warm, plain (got “" + "t" * 80 + "…” (20,000 characters))",
        ),
        ({"tone": None}, "at tone: must be one of warm, plain (got null)"),
        ({"description": 4}, "at description: must be a string (got 4)"),
        (
            {"headline": ["H"] * LONG},
            "at headline: must be a string (got [" + '"H",' * 19 + '"H"… (80,001 characters of JSON))',
        ),
        ({"bullets": ["oak" + "k" * LONG]}, "at bullets/0: must match the pattern ^[A-Z] (got “oak"),
        ({"bullets": ["A"] * 7}, "at bullets: has 7 items, at most 5 allowed"),
        ({"width_cm": -3}, "at width_cm: must be at least 0 (got -3)"),
        (
            {"extra": "e" * LONG, "more": 1},
            "at the draft: has properties the schema does not allow: extra, more",
        ),
    ],
    ids=[
        "enum",
        "enum null",
        "type",
        "type of a long list",
        "pattern",
        "maxItems",
        "minimum",
        "closed object",
    ],
)
def test_a_schema_mismatch_names_the_path_and_the_rule_before_the_value(change, expected):
    reason = one_reason({**FINE, **change, "notes": "n" * LONG})

    assert reason.code == ReasonCode.SCHEMA_MISMATCH
    assert reason.startswith(f"Does not match the output schema {expected}"), reason


def test_a_missing_required_property_is_named():
    reason = one_reason({"notes": "n" * LONG})

    assert (
        reason
        == "Does not match the output schema at the draft: lacks the required properties headline, description"
    )


def test_an_unstated_claim_says_its_words_and_where_the_draft_makes_them():
    draft = "An oak board. " * 700 + "It is fully waterproof for outdoor use. " + "Oiled by hand. " * 600

    reason = one_reason(draft, CLAIMS, {})

    assert reason.code == ReasonCode.UNSTATED_CLAIM
    assert reason == (
        "Claims “waterproof”, which the product's source does not state: "
        "“…An oak board. It is fully waterproof for outdoor use. Oiled by…”"
    )


def test_an_edit_is_refused_in_the_same_words():
    prompt = PromptVersion(
        task="t",
        version=1,
        system_message="s",
        template="{title}",
        output_schema=SCHEMA,
        rules={"text_field": "description", **CLAIMS},
    )
    revision = SourceRevision(title="Oak chopping board", fields={"material": "oak"})

    def refused(text: str) -> list[str]:
        return edit_reasons(prompt=prompt, revision=revision, version=_Answer(json.dumps(FINE)), text=text)

    assert refused("x" * LONG) == ["Too long: description is 20,000 characters, the limit is 1,200"]
    assert refused("Oak.") == ["Too short: description is 4 characters, the minimum is 40"]
    assert refused("A solid oak chopping board, oiled by hand. " * 20 + "Fully waterproof.") == [
        "Claims “waterproof”, which the product's source does not state: “…board, oiled by hand. Fully waterproof.”"
    ]


class _Answer:
    """What `edit_reasons` reads of the version an edit replaces: its answer."""

    def __init__(self, answer: str):
        self.answer = answer
