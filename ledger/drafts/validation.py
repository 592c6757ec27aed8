"""Is a draft usable? Checks that depend only on the draft, its prompt and its source revision."""

import functools
import json
import re
from collections.abc import Iterator
from typing import NamedTuple

import jiter
import jsonschema
from referencing.exceptions import Unresolvable

from ..models import PromptVersion, SourceRevision, canonical_json
from ..states import DraftNote, ReasonCode
from .schema_refs import NO_RETRIEVAL
from .scrubbing import fit_to_keep, fits_text


def source_text(revision: SourceRevision) -> str:
    """Every word the source states: the title, field names, and every name and value inside a
    field's lists and objects. One piece a line, so a claim of two words never spans two pieces."""
    return source_text_of(revision.title, revision.fields)


def source_text_of(title: str, fields: dict) -> str:
    parts = [title]
    for name, value in fields.items():
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
    return render_prompt(prompt, title=revision.title, fields=revision.fields)


def render_prompt(prompt: PromptVersion, *, title: str, fields: dict) -> str:
    """The user message for a revision's title and fields (read as values, without the revision)."""
    facts = "\n".join(f"- {key}: {fact_text(value)}" for key, value in sorted(fields.items()))
    return prompt.template.format(title=title, facts=facts or "- (none)")


# Characters of a validator's words kept in a reason.
REASON_DETAIL_LIMIT = 300


def shortened(text: str) -> str:
    """`text` cut to REASON_DETAIL_LIMIT characters, fit to keep: a reason never holds a whole answer."""
    if len(text) > REASON_DETAIL_LIMIT:
        text = text[: REASON_DETAIL_LIMIT - 1] + "…"
    return fit_to_keep(text)


class Reason(str):
    """One reason a draft is unusable: its text, and its `ReasonCode` in `.code`."""

    code: str

    def __new__(cls, code: str, text: str) -> "Reason":
        reason = super().__new__(cls, text)
        reason.code = code
        return reason


class Checked(NamedTuple):
    """What checking one draft found: its publishable text, the reasons it is unusable (none:
    valid), the claims it makes (judged against its source by `DraftChecker.unstated`), and notes
    on how it was read (`DraftNote` values)."""

    text: str
    reasons: list[Reason]
    claimed: list[tuple[str, re.Pattern]]
    notes: list[str]


def check_draft(
    *, prompt: PromptVersion, revision: SourceRevision, output: str, truncated: bool = False
) -> Checked:
    """`DraftChecker.check`, with its claims judged against the revision's source."""
    checker = DraftChecker.of(prompt)
    checked = checker.check(output, truncated=truncated)
    return checked._replace(
        reasons=checked.reasons + checker.unstated(checked.claimed, source_text(revision))
    )


class DraftChecker:
    """One prompt version's checks, prepared once (its schema's validator, its claim words'
    patterns) and shared by every draft checked against it: collecting a unit checks thousands."""

    def __init__(self, output_schema: dict, rules: dict):
        self.rules = rules
        self.validator = None
        self.accepts = None
        if output_schema:
            cls = jsonschema.validators.validator_for(output_schema)
            cls.check_schema(output_schema)
            # A registry that fetches nothing: a $ref outside the schema is unresolvable, never
            # retrieved (a schema stored before prompt versions refused them may still hold one).
            self.validator = cls(output_schema, registry=NO_RETRIEVAL)
            self.accepts = plain_schema_check(output_schema)
        # (word, the word as it is looked for, its pattern): a plain substring test first, as most
        # drafts claim none of them.
        self.claims = [
            (word, word.lower(), re.compile(rf"(?<![\w-]){re.escape(word.lower())}(?![\w-])"))
            for word in rules.get("claim_words", [])
        ]

    @classmethod
    def of(cls, prompt: PromptVersion) -> "DraftChecker":
        # Keyed by content, not id: a prompt version is immutable once used, and an unsaved one
        # (a preview) has no id.
        return _checker(canonical_json([prompt.output_schema, prompt.rules]))

    def check(self, output: str, *, truncated: bool = False) -> Checked:
        """The draft's checks. Its claims are judged against the source by `unstated`, so a caller
        checking many drafts reads the sources of only those that claim something. `truncated`:
        the provider says the model stopped at its output-token limit, so the draft is cut off
        whatever it reads like."""
        if truncated:
            reason = Reason(
                ReasonCode.TRUNCATED,
                "Cut off: the model reached the prompt version's max_output_tokens before it finished",
            )
            return Checked(output, [reason], [], [])
        rules = self.rules
        text = output
        notes = []
        if self.validator is not None:
            try:
                data, text, notes = read_draft(output)
            except (ValueError, RecursionError):  # RecursionError: nested deeper than Python reads
                reason = Reason(ReasonCode.NOT_JSON, "The draft is not the JSON the prompt asked for")
                return Checked(output, [reason], [], [])
            # jsonschema is the judge and writes the reason; a plain schema's own check (a hundred
            # times faster) only ever passes what jsonschema would pass.
            try:
                passed = self.accepts is not None and self.accepts(data)
                error = None if passed else jsonschema.exceptions.best_match(self.schema_errors(data))
            except RecursionError:
                reason = Reason(
                    ReasonCode.SCHEMA_MISMATCH, "Does not match the output schema: nested too deeply"
                )
                return Checked(text, [reason], [], notes)
            if error is not None:
                # jsonschema's message quotes the offending value, which may be the whole answer.
                where = shortened("/".join(str(p) for p in error.absolute_path)) or "the draft"
                reason = Reason(
                    ReasonCode.SCHEMA_MISMATCH,
                    f"Does not match the output schema at {where}: {shortened(error.message)}",
                )
                return Checked(text, [reason], [], notes)
            text_field = rules.get("text_field")
            if text_field:
                text = str(data.get(text_field, ""))
            if not fits_text(text):  # a NUL or a lone surrogate written as a JSON escape
                reason = Reason(ReasonCode.GARBLED_ANSWER, "The draft holds a NUL or a broken character")
                return Checked(output, [reason], [], notes)
        reasons = []
        min_length, max_length = rules.get("min_length"), rules.get("max_length")
        if min_length and len(text) < min_length:
            reasons.append(
                Reason(
                    ReasonCode.TOO_SHORT, f"Too short: {len(text)} characters, at least {min_length} needed"
                )
            )
        if max_length and len(text) > max_length:
            reasons.append(
                Reason(ReasonCode.TOO_LONG, f"Too long: {len(text)} characters, at most {max_length} allowed")
            )
        lowered = text.lower()
        claimed = [
            (word, pattern)
            for word, lowered_word, pattern in self.claims
            if lowered_word in lowered and pattern.search(lowered)
        ]
        return Checked(text, reasons, claimed, notes)

    def schema_errors(self, data: object) -> Iterator[jsonschema.ValidationError]:
        """jsonschema's errors for `data`. A reference the schema cannot follow is one more error,
        never fetched and never an exception that would stop the collection of a unit."""
        try:
            yield from self.validator.iter_errors(data)
        except Unresolvable as exc:
            yield jsonschema.ValidationError(
                f"the schema's $ref {str(exc.ref)[:100]!r} cannot be followed: it points to nothing "
                "inside the schema, and nothing outside it is ever fetched"
            )

    @staticmethod
    def unstated(claimed: list[tuple[str, re.Pattern]], source: str) -> list[Reason]:
        """The claims `source` (its `source_text`) does not state, as reasons."""
        return [
            Reason(ReasonCode.UNSTATED_CLAIM, f"Claims “{word}”, which the product's source does not state")
            for word, pattern in claimed
            if not pattern.search(source)
        ]


def read_json(text: str) -> object:
    """`json.loads(text)`, read by jiter (pydantic's parser, several times faster) when it can: it
    refuses what the json module reads beyond strict JSON (NaN, Infinity, a lone surrogate), which
    the json module then reads."""
    try:
        return jiter.from_json(text.encode(), allow_inf_nan=False, cache_mode="keys")
    except (UnicodeEncodeError, ValueError):
        return json.loads(text)


# A whole answer that is one Markdown code block: an opening fence (bare or labelled `json`) on a
# line of its own, the body, and a closing fence, with nothing but whitespace around them. Models
# asked for JSON often answer so; anything more (prose beside it, two blocks) is not read.
CODE_FENCE = re.compile(
    r"\A\s*```[ \t]*(?:json)?[ \t]*\r?\n(?P<body>.*?)\r?\n[ \t]*```\s*\Z", re.DOTALL | re.I
)


def read_draft(output: str) -> tuple[object, str, list[str]]:
    """(the JSON a draft holds, the text it was read from, notes on how): the draft itself, or else
    the body of the one code block it is (`CODE_FENCE`), noted. ValueError when neither is JSON."""
    try:
        return read_json(output), output, []
    except ValueError:
        match = CODE_FENCE.match(output)
        if match is None:
            raise
        return read_json(match["body"]), match["body"], [DraftNote.READ_FROM_CODE_FENCE.value]


@functools.lru_cache(maxsize=64)
def _checker(key: str) -> DraftChecker:
    output_schema, rules = json.loads(key)
    return DraftChecker(output_schema, rules)


# What `plain_schema_check` understands; a schema using any other keyword is left to jsonschema.
PLAIN_KEYWORDS = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "minLength",
    "maxLength",
    "title",
    "description",
}
PLAIN_TYPES = {
    "object": lambda value: isinstance(value, dict),
    "string": lambda value: isinstance(value, str),
    "boolean": lambda value: isinstance(value, bool),
    "null": lambda value: value is None,
}


def plain_schema_check(schema: object):
    """For a schema made only of objects, strings, booleans and nulls (`type`, `properties`,
    `required`, `additionalProperties: false`, `minLength`, `maxLength`): a function that says
    True when a value passes it, as jsonschema would. None for any other schema."""
    if not isinstance(schema, dict) or set(schema) - PLAIN_KEYWORDS:
        return None
    kind = schema.get("type")
    if not isinstance(kind, str) or kind not in PLAIN_TYPES:
        return None
    is_type = PLAIN_TYPES[kind]
    if kind == "string":
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        if not isinstance(low, int) or not (high is None or isinstance(high, int)):
            return None
        return lambda value: (
            isinstance(value, str) and low <= len(value) and (high is None or len(value) <= high)
        )
    if set(schema) & {"minLength", "maxLength"}:
        return None
    if kind != "object":
        return is_type if set(schema) <= {"type", "title", "description"} else None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra_allowed = schema.get("additionalProperties", True)
    if (
        not isinstance(properties, dict)
        or not isinstance(required, list)
        or not isinstance(extra_allowed, bool)
    ):
        return None
    checks = {name: plain_schema_check(sub) for name, sub in properties.items()}
    if None in checks.values():
        return None
    allowed = set(properties)

    def passes(value: object) -> bool:
        return (
            isinstance(value, dict)
            and all(name in value for name in required)
            and (extra_allowed or set(value) <= allowed)
            and all(check(value[name]) for name, check in checks.items() if name in value)
        )

    return passes
