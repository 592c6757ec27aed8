"""Is a draft usable? Checks that depend only on the draft, its prompt and its source revision."""

import functools
import json
import re
from collections.abc import Iterator
from typing import NamedTuple

import jiter
import jsonschema
from referencing.exceptions import Unresolvable

from ..models import PromptVersion, SourceRevision, canonical_json, compact_json
from ..states import DraftNote, ReasonCode
from .reasons import Reason, not_json, schema_reason, too_long, too_short, unstated_claim
from .schema_dialects import Dialect, answer_reader
from .schema_refs import NO_RETRIEVAL
from .scrubbing import fits_text


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


class Claim(NamedTuple):
    """A claim word a draft makes: the word, its pattern, and where the draft makes it (a span of
    the draft's text, to quote)."""

    word: str
    pattern: re.Pattern
    at: tuple[int, int] | None


class Checked(NamedTuple):
    """What checking one draft found: its publishable text, the reasons it is unusable (none:
    valid), the claims it makes (judged against its source by `DraftChecker.unstated`), and notes
    on how it was read (`DraftNote` values)."""

    text: str
    reasons: list[Reason]
    claimed: list[Claim]
    notes: list[str]


def check_draft(
    *,
    prompt: PromptVersion,
    revision: SourceRevision,
    output: str,
    truncated: bool = False,
    dialect: str = Dialect.AS_IS,
) -> Checked:
    """`DraftChecker.check`, with its claims judged against the revision's source."""
    checker = DraftChecker.of(prompt, dialect=dialect)
    checked = checker.check(output, truncated=truncated)
    return checked._replace(
        reasons=checked.reasons + checker.unstated(checked.claimed, checked.text, source_text(revision))
    )


class DraftChecker:
    """One prompt version's checks of the drafts of one schema dialect, prepared once (its schema's
    validator, how the dialect's answers read back, its claim words' patterns) and shared by every
    draft checked against it: collecting a unit checks thousands.

    `dialect`: the dialect the provider was sent the schema in (`schema_dialects`); a draft is read
    as it was asked for (rule 19) before it is checked. A text a person wrote (an edit) was asked in
    no dialect: `as_is`, the default."""

    def __init__(self, output_schema: dict, rules: dict, dialect: str = Dialect.AS_IS):
        self.rules = rules
        self.validator = None
        self.accepts = None
        self.reader = None
        if output_schema:
            cls = jsonschema.validators.validator_for(output_schema)
            cls.check_schema(output_schema)
            # A registry that fetches nothing: a $ref outside the schema is unresolvable, never
            # retrieved (a schema stored before prompt versions refused them may still hold one).
            self.validator = cls(output_schema, registry=NO_RETRIEVAL)
            self.accepts = plain_schema_check(output_schema)
            self.reader = answer_reader(output_schema, dialect, self.validator)
        # (word, the word as it is looked for, its pattern): a plain substring test first, as most
        # drafts claim none of them.
        self.claims = [
            (word, word.lower(), re.compile(rf"(?<![\w-]){re.escape(word.lower())}(?![\w-])"))
            for word in rules.get("claim_words", [])
        ]

    @classmethod
    def of(cls, prompt: PromptVersion, *, dialect: str = Dialect.AS_IS) -> "DraftChecker":
        # Keyed by content, not id: a prompt version is immutable once used, and an unsaved one
        # (a preview) has no id. In the schema's order, which decides which of several errors a
        # draft is refused for.
        return _checker(compact_json([prompt.output_schema, prompt.rules]), str(dialect))

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
        text_field = rules.get("text_field")
        if self.validator is not None:
            try:
                data, text, notes = read_draft(output)
            except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than Python reads
                return Checked(output, [not_json(output, exc)], [], [])
            try:
                if self.reader is not None:
                    read = self.reader.read(data)
                    if read is not data:
                        # What the schema describes is what is checked, stored, shown and applied;
                        # the answer as returned stays the version's raw output.
                        data, notes = read, [*notes, DraftNote.NULLS_READ_AS_LEFT_OUT.value]
                        text = written(data)
                # jsonschema is the judge (its error worded by `schema_reason`); a plain schema's
                # own check (a hundred times faster) only ever passes what jsonschema would pass.
                passed = self.accepts is not None and self.accepts(data)
                error = None if passed else jsonschema.exceptions.best_match(self.schema_errors(data))
            except RecursionError:
                reason = Reason(
                    ReasonCode.SCHEMA_MISMATCH, "Does not match the output schema: nested too deeply"
                )
                return Checked(text, [reason], [], notes)
            if error is not None:
                return Checked(text, [schema_reason(error)], [], notes)
            if text_field:
                value = data.get(text_field)
                text = "" if value is None else str(value)  # left out, or the author's null: no text
            if not fits_text(text):  # a NUL or a lone surrogate written as a JSON escape
                reason = Reason(ReasonCode.GARBLED_ANSWER, "The draft holds a NUL or a broken character")
                return Checked(output, [reason], [], notes)
        reasons = []
        where = text_field or "the draft"
        min_length, max_length = rules.get("min_length"), rules.get("max_length")
        if min_length and len(text) < min_length:
            reasons.append(too_short(where, len(text), min_length))
        if max_length and len(text) > max_length:
            reasons.append(too_long(where, len(text), max_length))
        lowered = text.lower()
        claimed = []
        for word, lowered_word, pattern in self.claims:
            if lowered_word in lowered and (found := pattern.search(lowered)):
                # Quoted from the text as written where lowering kept every character in place.
                at = found.span() if len(lowered) == len(text) else None
                claimed.append(Claim(word, pattern, at))
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
    def unstated(claimed: list[Claim], text: str, source: str) -> list[Reason]:
        """The claims of the draft `text` that `source` (its `source_text`) does not state, as reasons."""
        return [
            unstated_claim(claim.word, text, claim.at)
            for claim in claimed
            if not claim.pattern.search(source)
        ]


def written(data: object) -> str:
    """An answer the ledger read back, written as JSON again: readable, unless a character of it (a
    lone surrogate) has no UTF-8, when it is escaped as the model wrote it."""
    text = json.dumps(data, ensure_ascii=False)
    return text if fits_text(text) else json.dumps(data)


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
def _checker(key: str, dialect: str) -> DraftChecker:
    output_schema, rules = json.loads(key)
    return DraftChecker(output_schema, rules, dialect)


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
