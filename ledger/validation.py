"""Is a draft usable? Checks that depend only on the draft, its prompt and its source revision."""

import json
import re
from collections.abc import Iterator

import jsonschema

from .models import PromptVersion, SourceRevision, canonical_json
from .states import ReasonCode


def source_text(revision: SourceRevision) -> str:
    """Every word the source states: the title, field names, and every name and value inside a
    field's lists and objects. One piece a line, so a claim of two words never spans two pieces."""
    parts = [revision.title]
    for name, value in revision.fields.items():
        parts.append(name)
        parts.extend(_pieces(value))
    return "\n".join(parts).lower()


def _pieces(value: object) -> Iterator[str]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield key
            yield from _pieces(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _pieces(inner)
    elif value is not None:
        yield str(value)


def fact_text(value: object) -> str:
    """A field's value in a prompt: a list or an object as compact canonical JSON (the same text
    whichever database stored it), anything else as it reads."""
    return canonical_json(value) if isinstance(value, list | dict) else str(value)


def render_user_message(prompt: PromptVersion, revision: SourceRevision) -> str:
    facts = "\n".join(f"- {key}: {fact_text(value)}" for key, value in sorted(revision.fields.items()))
    return prompt.template.format(title=revision.title, facts=facts or "- (none)")


class Reason(str):
    """One reason a draft is unusable: its text, and its `ReasonCode` in `.code`."""

    code: str

    def __new__(cls, code: str, text: str) -> "Reason":
        reason = super().__new__(cls, text)
        reason.code = code
        return reason


def check_draft(*, prompt: PromptVersion, revision: SourceRevision, output: str) -> tuple[str, list[Reason]]:
    """Return (publishable text, reasons it is unusable). No reasons means valid."""
    rules = prompt.rules
    text = output
    if prompt.output_schema:
        try:
            data = json.loads(output)
        except ValueError:
            return output, [Reason(ReasonCode.NOT_JSON, "The draft is not the JSON the prompt asked for")]
        try:
            jsonschema.validate(data, prompt.output_schema)
        except jsonschema.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "the draft"
            return output, [
                Reason(
                    ReasonCode.SCHEMA_MISMATCH, f"Does not match the output schema at {where}: {exc.message}"
                )
            ]
        text_field = rules.get("text_field")
        text = str(data.get(text_field, "")) if text_field else output
    reasons = []
    min_length, max_length = rules.get("min_length"), rules.get("max_length")
    if min_length and len(text) < min_length:
        reasons.append(
            Reason(ReasonCode.TOO_SHORT, f"Too short: {len(text)} characters, at least {min_length} needed")
        )
    if max_length and len(text) > max_length:
        reasons.append(
            Reason(ReasonCode.TOO_LONG, f"Too long: {len(text)} characters, at most {max_length} allowed")
        )
    source = source_text(revision)
    lowered = text.lower()
    for word in rules.get("claim_words", []):
        pattern = rf"(?<![\w-]){re.escape(word.lower())}(?![\w-])"
        if re.search(pattern, lowered) and not re.search(pattern, source):
            reasons.append(
                Reason(
                    ReasonCode.UNSTATED_CLAIM, f"Claims “{word}”, which the product's source does not state"
                )
            )
    return text, reasons
