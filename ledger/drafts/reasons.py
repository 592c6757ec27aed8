"""The words of a draft's failure reasons (SPEC rule 19). Each says what failed, its cause first:
which property broke which rule of the output schema, a text's length and its limit, why the
answer is not JSON, the claim and where the draft makes it. A reason may quote the draft, after its
cause and cut short (`quoted`): the quote gives way, never the cause, so the reason for a
20,000-character draft still says why it failed. Each reason carries its `ReasonCode`, which the
screens group by."""

import json
import re
from collections.abc import Iterable

import jsonschema

from ..states import ReasonCode
from .scrubbing import fit_to_keep

# Characters of the draft a reason quotes.
QUOTE_CHARS = 80
# Characters of a name a reason repeats: a property's path, a value the schema allows, a pattern.
NAME_CHARS = 100
# Names a reason lists (an enum's values, the properties a draft lacks) before "and N more".
NAMES_LISTED = 10
# Characters either side of a claim a reason quotes.
CLAIM_CONTEXT_CHARS = 30


class Reason(str):
    """One reason a draft is unusable: its text, and its `ReasonCode` in `.code`."""

    code: str

    def __new__(cls, code: str, text: str) -> "Reason":
        reason = super().__new__(cls, fit_to_keep(text))
        reason.code = code
        return reason


def quoted(value: object) -> str:
    """A value of the draft as a reason quotes it: a text in quotes, anything else as JSON, cut to
    QUOTE_CHARS and then saying how long it was."""
    if isinstance(value, str):
        if len(value) <= QUOTE_CHARS:
            return f"“{value}”"
        return f"“{value[:QUOTE_CHARS]}…” ({len(value):,} characters)"
    text = as_json(value)
    if len(text) <= QUOTE_CHARS:
        return text
    return f"{text[:QUOTE_CHARS]}… ({len(text):,} characters of JSON)"


def as_json(value: object) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return f"a {type(value).__name__}"


def name(value: object) -> str:
    """A name from the schema or the draft (a value, a property, a pattern), cut to NAME_CHARS."""
    text = value if isinstance(value, str) else as_json(value)
    return text if len(text) <= NAME_CHARS else text[:NAME_CHARS] + "…"


def listed(values: Iterable[object]) -> str:
    """Names, comma-separated, at most NAMES_LISTED of them."""
    values = list(values)
    shown = ", ".join(name(value) for value in values[:NAMES_LISTED])
    more = len(values) - NAMES_LISTED
    return f"{shown} and {more:,} more" if more > 0 else shown


def place(path: Iterable[object]) -> str:
    """Where in the draft: a property's path (`dimensions/unit`, `bullets/0/text`), or "the draft"."""
    return name("/".join(str(part) for part in path)) or "the draft"


def too_long(where: str, length: int, limit: int) -> Reason:
    return Reason(ReasonCode.TOO_LONG, f"Too long: {where} is {length:,} characters, the limit is {limit:,}")


def too_short(where: str, length: int, limit: int) -> Reason:
    return Reason(
        ReasonCode.TOO_SHORT, f"Too short: {where} is {length:,} characters, the minimum is {limit:,}"
    )


def not_json(draft: str, error: Exception) -> Reason:
    """The draft could not be read as JSON: the parser's complaint and where, then its start."""
    if isinstance(error, json.JSONDecodeError):
        cause = f"{error.msg.rstrip(': ')} (line {error.lineno:,}, column {error.colno:,})"
    elif isinstance(error, RecursionError):
        cause = "it nests deeper than it can be read"
    else:
        cause = name(str(error))
    return Reason(
        ReasonCode.NOT_JSON, f"Not the JSON the prompt asked for: {cause}; the draft reads {quoted(draft)}"
    )


# How a schema's types read in a reason.
TYPE_WORDS = {
    "string": "a string",
    "number": "a number",
    "integer": "an integer",
    "boolean": "true or false",
    "object": "an object",
    "array": "an array",
    "null": "null",
}
BOUNDS = {
    "minimum": "at least",
    "maximum": "at most",
    "exclusiveMinimum": "more than",
    "exclusiveMaximum": "less than",
    "multipleOf": "a multiple of",
}


def schema_reason(error: jsonschema.ValidationError) -> Reason:
    """jsonschema's error as a reason: where, and which rule it broke, in words that never quote more
    of the draft than `quoted` does. A text too long or too short for its property is `too_long` or
    `too_short`, with its length and the limit."""
    where = place(error.absolute_path)
    keyword, rule, value = error.validator, error.validator_value, error.instance
    if keyword in ("maxLength", "minLength") and isinstance(value, str) and isinstance(rule, int):
        return (too_long if keyword == "maxLength" else too_short)(where, len(value), rule)
    return Reason(ReasonCode.SCHEMA_MISMATCH, f"Does not match the output schema at {where}: {broken(error)}")


def broken(error: jsonschema.ValidationError) -> str:
    """Which rule the value broke, then the value (cut short) where it helps."""
    keyword, rule, value = error.validator, error.validator_value, error.instance
    got = f" (got {quoted(value)})"
    if not isinstance(keyword, str):
        # A `false` schema (keyword None), or an error of the ledger's own words.
        return "nothing is allowed here" + got if keyword is None else error.message
    if keyword == "type":
        kinds = [rule] if isinstance(rule, str) else rule if isinstance(rule, list) else []
        return f"must be {' or '.join(TYPE_WORDS.get(kind, name(kind)) for kind in kinds)}" + got
    if keyword == "enum" and isinstance(rule, list):
        return f"must be one of {listed(rule)}" + got
    if keyword == "const":
        return f"must be {name(rule)}" + got
    if keyword == "required" and isinstance(value, dict) and isinstance(rule, list):
        missing = [key for key in rule if key not in value]
        return f"lacks the required propert{'y' if len(missing) == 1 else 'ies'} {listed(missing)}"
    if keyword == "additionalProperties" and isinstance(value, dict):
        extra = unexpected_properties(value, error.schema)
        return f"has propert{'y' if len(extra) == 1 else 'ies'} the schema does not allow: {listed(extra)}"
    if keyword in BOUNDS:
        return f"must be {BOUNDS[keyword]} {name(rule)}" + got
    if keyword == "pattern":
        return f"must match the pattern {name(rule)}" + got
    if keyword == "format":
        return f"must be a valid {name(rule)}" + got
    if keyword in ("minItems", "maxItems") and isinstance(value, list):
        bound = "at least" if keyword == "minItems" else "at most"
        return f"has {len(value):,} items, {bound} {name(rule)} allowed"
    if keyword in ("minProperties", "maxProperties") and isinstance(value, dict):
        bound = "at least" if keyword == "minProperties" else "at most"
        return f"has {len(value):,} properties, {bound} {name(rule)} allowed"
    if keyword == "uniqueItems":
        return "repeats an item; each must be different" + got
    if keyword in ("anyOf", "oneOf"):
        if keyword == "oneOf" and "is valid under each of" in error.message:
            return "matches more than one of the alternatives the schema offers (oneOf)" + got
        return f"matches none of the alternatives the schema offers ({keyword})" + got
    if keyword == "not":
        return "is what the schema rules out (not)" + got
    return f"breaks the schema's {keyword} rule ({name(rule)})" + got


def unexpected_properties(value: dict, schema: object) -> list[str]:
    """The properties of `value` its object schema names neither in `properties` nor by a pattern."""
    schema = schema if isinstance(schema, dict) else {}
    known = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    patterns = schema.get("patternProperties") if isinstance(schema.get("patternProperties"), dict) else {}
    return [
        key for key in value if key not in known and not any(re.search(pattern, key) for pattern in patterns)
    ]


def unstated_claim(word: str, text: str, at: tuple[int, int] | None) -> Reason:
    """A claim the source does not state: its words, then where the draft makes it (`at`, the span
    of the claim in `text`)."""
    reason = f"Claims “{word}”, which the product's source does not state"
    if at is None:
        return Reason(ReasonCode.UNSTATED_CLAIM, reason)
    start, end = max(0, at[0] - CLAIM_CONTEXT_CHARS), min(len(text), at[1] + CLAIM_CONTEXT_CHARS)
    if start and (space := text.find(" ", start, at[0])) != -1:
        start = space + 1  # whole words only
    if end < len(text) and (space := text.rfind(" ", at[1], end)) != -1:
        end = space
    excerpt = ("…" if start else "") + " ".join(text[start:end].split()) + ("…" if end < len(text) else "")
    return Reason(ReasonCode.UNSTATED_CLAIM, f"{reason}: “{excerpt}”")
