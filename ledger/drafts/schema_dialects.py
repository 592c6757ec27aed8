"""Each provider's dialect of a prompt version's output schema (SPEC rule 17).

A provider is sent the schema in the words it accepts; whatever a dialect cannot say is listed as
left to the ledger, whose own check (`validation.DraftChecker`) always reads the prompt version's
whole schema. Dialects:

- `openai_strict`: OpenAI's strict Structured Outputs (reference/providers.md §8.1). Every object
  closed and every property required (an optional one may be null instead); only the keywords
  the subset accepts. Used by `openai`, `emulator` and, by default, `openai_compatible`.
- `gemini`: the JSON Schema subset Gemini's `responseJsonSchema` takes (§8.2): no length rules.
- `as_is`: the schema unchanged. Anthropic's tool `input_schema` and Cloudflare's `json_schema`
  take any JSON Schema (neither decodes under it strictly: the model reads it, so the length
  rules it carries are worth sending); a vLLM-style server behind `openai_compatible` too.

A conversion is made once per schema and dialect (cached by content), not for every request.

A dialect that asks for more than the schema says reads its answers back (`answer_reader`, SPEC rule
19): the strict dialect sends an optional property as required-or-null, so a null there is the
property left out; the ledger checks, stores and shows the answer as the schema describes it.
"""

import functools
import json
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import unquote

from referencing.exceptions import Unresolvable

from ..models import compact_json


class Dialect(StrEnum):
    OPENAI_STRICT = "openai_strict"
    GEMINI = "gemini"
    AS_IS = "as_is"


@dataclass(frozen=True)
class LeftToLedger:
    """One keyword of the prompt version's schema the provider is not sent, where it stands (a
    JSON Pointer into that schema, "" for the root), and how the dialect said it instead, if at all."""

    keyword: str
    path: str
    instead: str = ""

    def __str__(self) -> str:
        where = self.path or "the root"
        return f"{self.keyword} at {where}" + (f" ({self.instead})" if self.instead else "")


@dataclass(frozen=True)
class SentSchema:
    """What a provider is sent for a schema, and what only the ledger checks. Shared by every
    request of a unit: never changed by the caller."""

    schema: dict
    left_to_ledger: tuple[LeftToLedger, ...]


def sent_schema(schema: dict, dialect: str) -> SentSchema:
    """The schema in `dialect`, and what it leaves to the ledger."""
    if dialect == Dialect.AS_IS:
        return SentSchema(schema, ())
    # Keyed by its JSON text in its own key order: the order of properties is the order a model
    # writes them in, so it is kept.
    return _sent_schema(compact_json(schema), dialect)


@functools.lru_cache(maxsize=64)
def _sent_schema(key: str, dialect: str) -> SentSchema:
    schema = json.loads(key)
    left: list[LeftToLedger] = []
    convert = {Dialect.OPENAI_STRICT: _strict, Dialect.GEMINI: _gemini}[Dialect(dialect)]
    return SentSchema(convert(schema, "", left), tuple(left))


def _pointer(path: str, *names: str | int) -> str:
    return path + "".join("/" + str(name).replace("~", "~0").replace("/", "~1") for name in names)


# --- OpenAI strict -------------------------------------------------------------------------------

# Kept as they are (§8.1). `type`, `properties`, `required`, `additionalProperties`, `items`,
# `anyOf`, `$ref` and the definitions are rebuilt below.
STRICT_PLAIN = {"title", "description", "pattern", "enum", "minItems", "maxItems", "multipleOf"}
STRICT_BOUNDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
STRICT_FORMATS = {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
DEFINITIONS = ("$defs", "definitions")
# What strict mode cannot leave open: a value of any type. Asked for as any scalar; the ledger
# still accepts a list or an object there.
ANY_SCALAR = [{"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"}]
NULL = {"type": "null"}


def _strict(node: object, path: str, left: list[LeftToLedger]) -> dict:
    if not isinstance(node, dict):
        # `true` (anything) or `false` (nothing): strict mode has no word for either.
        left.append(LeftToLedger(json.dumps(node), path, "sent as any string, number, boolean or null"))
        return {"anyOf": ANY_SCALAR}
    if "$ref" in node and path:
        # Strict mode takes a reference alone; what stands beside it is the ledger's to check.
        left.extend(LeftToLedger(key, path) for key in node if key != "$ref")
        return {"$ref": node["$ref"]}
    out: dict = {}
    for key, value in node.items():
        if key in STRICT_PLAIN:
            out[key] = value
        elif key in STRICT_BOUNDS and isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = value
        elif key == "format" and value in STRICT_FORMATS:
            out[key] = value
        elif key == "type":
            out[key] = value
        elif key == "const" and "enum" not in node:
            out["enum"] = [value]
        elif key in ("anyOf", "oneOf") and isinstance(value, list):
            if key == "oneOf":
                if "anyOf" in node:
                    left.append(LeftToLedger(key, path))
                    continue
                left.append(LeftToLedger(key, path, "sent as anyOf: more than one may match"))
            out["anyOf"] = [_strict(branch, _pointer(path, key, i), left) for i, branch in enumerate(value)]
        elif key in DEFINITIONS and isinstance(value, dict):
            out[key] = {name: _strict(sub, _pointer(path, key, name), left) for name, sub in value.items()}
        elif key in ("properties", "required", "additionalProperties", "items"):
            continue  # below
        else:  # a keyword strict mode refuses, or a $ref at the root (which must be an object)
            left.append(LeftToLedger(key, path))
    kinds = node.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) else []
    if "object" in kinds or (not kinds and "properties" in node):
        _close_object(node, out, path, left)
    elif "properties" in node or "required" in node or "additionalProperties" in node:
        left.extend(
            LeftToLedger(key, path)
            for key in ("properties", "required", "additionalProperties")
            if key in node
        )
    if "array" in kinds:
        items = node.get("items")
        if isinstance(items, dict):
            out["items"] = _strict(items, _pointer(path, "items"), left)
        else:
            if "items" in node:
                left.append(LeftToLedger("items", path))
            out["items"] = {"anyOf": ANY_SCALAR}
    elif "items" in node:
        left.append(LeftToLedger("items", path))
    if not ({"type", "anyOf"} & set(out)):
        if "enum" in out:
            out["type"] = _types_of(out["enum"])
        else:
            left.append(LeftToLedger("type", path, "absent: sent as any string, number, boolean or null"))
            out["anyOf"] = ANY_SCALAR
    return out


def _close_object(node: dict, out: dict, path: str, left: list[LeftToLedger]) -> None:
    """Strict mode's object: closed, with every property required; one the schema leaves out may
    be null instead."""
    properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
    required = node.get("required") if isinstance(node.get("required"), list) else []
    out.setdefault("type", "object")
    out["properties"] = {}
    for name, sub in properties.items():
        converted = _strict(sub, _pointer(path, "properties", name), left)
        out["properties"][name] = converted if name in required else _or_null(converted)
    out["required"] = list(properties)
    out["additionalProperties"] = False
    if "additionalProperties" in node and node["additionalProperties"] is not False:
        left.append(LeftToLedger("additionalProperties", path, "sent closed: no other keys"))
    if set(required) - set(properties):
        left.append(LeftToLedger("required", path, "names a key with no schema in properties"))
    if any(name not in required for name in properties):
        optional = ", ".join(name for name in properties if name not in required)
        left.append(LeftToLedger("required", path, f"{optional} sent as required, null allowed"))


def _or_null(schema: dict) -> dict:
    """`schema`, or null."""
    kind = schema.get("type")
    if isinstance(kind, str | list) and "anyOf" not in schema:
        kinds = [kind] if isinstance(kind, str) else list(kind)
        out = {**schema, "type": kinds if "null" in kinds else [*kinds, "null"]}
        if "enum" in out and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
        return out
    if "anyOf" in schema and set(schema) <= {"anyOf", "title", "description"}:
        branches = schema["anyOf"]
        return schema if NULL in branches else {**schema, "anyOf": [*branches, NULL]}
    return {"anyOf": [schema, NULL]}


# --- reading a strict answer back ------------------------------------------------------------------

# A property read as absent: not a JSON value.
LEFT_OUT = object()


def answer_reader(schema: dict, dialect: str, validator) -> "StrictAnswers | None":
    """How answers to `schema` sent in `dialect` read as the schema itself describes them; None when
    the dialect asked for nothing the schema does not say: every dialect but the strict one, and a
    strict schema whose properties are all required. `validator`: jsonschema's, for `schema` (it
    judges whether a property's schema takes null, and which of a union's branches an answer is)."""
    if dialect != Dialect.OPENAI_STRICT or not _leaves_optional(schema):
        return None
    return StrictAnswers(schema, validator)


def _leaves_optional(node: object) -> bool:
    """Whether a schema has, anywhere in it, an object with a property it does not require."""
    if isinstance(node, list):
        return any(_leaves_optional(inner) for inner in node)
    if not isinstance(node, dict):
        return False
    properties = node.get("properties")
    required = node.get("required") if isinstance(node.get("required"), list) else []
    if isinstance(properties, dict) and any(name not in required for name in properties):
        return True
    return any(_leaves_optional(inner) for key, inner in node.items() if key not in ("enum", "const"))


class StrictAnswers:
    """An answer to a schema sent in the strict dialect, read as the schema describes it.

    Strict mode makes every property required, and sends one the schema leaves optional as
    required-or-null (`_close_object`): the model cannot leave it out, so it writes null. Such a
    null, where the property's own schema takes no null, is read as the property left out, at every
    depth the dialect reached: nested objects, array items, references, a union's branches. A null
    the schema itself allows (its author made the property nullable) is kept, and so is a null a
    required property's schema refuses: the ledger's check refuses that draft."""

    def __init__(self, schema: dict, validator):
        self.root = schema
        self.validator = validator
        self._takes_null: dict[int, bool] = {}  # by the id of a property's schema, which `root` holds

    def read(self, answer: object) -> object:
        """The answer as the schema describes it: `answer` itself when nothing was left out (the
        usual case), else a copy without those properties. An answer nested deeper than Python
        reads raises RecursionError, as checking it would."""
        if not _holds_null(answer):
            return answer
        return self._read(answer, self.root, frozenset())

    def _read(self, value: object, node: object, following: frozenset) -> object:
        if not isinstance(node, dict):
            return value
        if "$ref" in node and node is not self.root:
            # Strict mode sends a reference alone: what it points at was sent in the dialect. A
            # reference met again before the answer goes deeper is a loop, read no further.
            ref = node["$ref"]
            target = self._target(ref)
            if target is None or ref in following:
                return value
            return self._read(value, target, following | {ref})
        kinds = node.get("type")
        kinds = [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) else []
        if isinstance(value, dict) and ("object" in kinds or (not kinds and "properties" in node)):
            value = self._read_object(value, node)
        elif isinstance(value, list) and "array" in kinds and isinstance(node.get("items"), dict):
            read = [self._read(inner, node["items"], frozenset()) for inner in value]
            if any(new is not old for new, old in zip(read, value, strict=True)):
                value = read
        branches = node.get("anyOf", node.get("oneOf"))
        if isinstance(branches, list) and branches:
            value = self._read_union(value, branches, following)
        return value

    def _read_object(self, value: dict, node: dict) -> dict:
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        required = node.get("required") if isinstance(node.get("required"), list) else []
        out = None
        for name, sub in properties.items():
            if name not in value:
                continue
            inner = value[name]
            if inner is None and name not in required and not self.takes_null(sub):
                read = LEFT_OUT
            else:
                read = self._read(inner, sub, frozenset())
            if read is inner:
                continue
            if out is None:
                out = dict(value)  # the other keys keep their place
            if read is LEFT_OUT:
                del out[name]
            else:
                out[name] = read
        return value if out is None else out

    def _read_union(self, value: object, branches: list, following: frozenset) -> object:
        """The answer read as the first branch it, read so, passes; as it is when it passes none."""
        for branch in branches:
            read = self._read(value, branch, following)
            if self.passes(read, branch):
                return read
        return value

    def takes_null(self, schema: object) -> bool:
        """Whether a property's own schema accepts null."""
        known = self._takes_null.get(id(schema))
        if known is None:
            known = self._takes_null[id(schema)] = self.passes(None, schema)
        return known

    def passes(self, value: object, schema: object) -> bool:
        """Whether `value` passes `schema`, a part of the whole; not when it refers to nothing (the
        ledger's check reports that)."""
        try:
            return self.validator.evolve(schema=schema).is_valid(value)
        except Unresolvable:
            return False

    def _target(self, ref: object) -> object:
        """What a reference inside the schema (`#` or a JSON Pointer `#/…`) points at; None for any
        other (the ledger's check reports it)."""
        if ref == "#":
            return self.root
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return None
        node: object = self.root
        for part in ref[2:].split("/"):
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node


def _holds_null(value: object) -> bool:
    waiting = [value]
    while waiting:
        inner = waiting.pop()
        if inner is None:
            return True
        if isinstance(inner, dict):
            waiting.extend(inner.values())
        elif isinstance(inner, list):
            waiting.extend(inner)
    return False


def _types_of(values: list) -> str | list[str]:
    """The JSON types of an enum's values: strict mode wants a type beside an enum."""
    kinds = sorted({JSON_TYPES[type(value)] for value in values})
    return kinds[0] if len(kinds) == 1 else kinds


JSON_TYPES = {
    bool: "boolean",
    str: "string",
    int: "integer",
    float: "number",
    type(None): "null",
    list: "array",
    dict: "object",
}


# --- Gemini --------------------------------------------------------------------------------------

# `responseJsonSchema`'s subset (§8.2): a schema keyword Gemini does not take is ignored or refused
# depending on the model, so none is sent. Length rules stay with the ledger.
GEMINI_PLAIN = {
    "title",
    "description",
    "type",
    "enum",
    "format",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "required",
    "$ref",
    "propertyOrdering",
}
GEMINI_SCHEMA_MAPS = {"properties", *DEFINITIONS}
GEMINI_SCHEMA_LISTS = {"anyOf", "prefixItems"}


def _gemini(node: object, path: str, left: list[LeftToLedger]) -> object:
    if not isinstance(node, dict):
        return node
    out: dict = {}
    for key, value in node.items():
        if key in GEMINI_PLAIN:
            out[key] = value
        elif key == "const" and "enum" not in node:
            out["enum"] = [value]
        elif key in GEMINI_SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _gemini(sub, _pointer(path, key, name), left) for name, sub in value.items()}
        elif key in GEMINI_SCHEMA_LISTS and isinstance(value, list):
            out[key] = [_gemini(sub, _pointer(path, key, i), left) for i, sub in enumerate(value)]
        elif key == "oneOf" and "anyOf" not in node and isinstance(value, list):
            left.append(LeftToLedger(key, path, "sent as anyOf: more than one may match"))
            out["anyOf"] = [_gemini(sub, _pointer(path, key, i), left) for i, sub in enumerate(value)]
        elif key in ("items", "additionalProperties") and isinstance(value, dict | bool):
            out[key] = _gemini(value, _pointer(path, key), left)
        else:
            left.append(LeftToLedger(key, path))
    return out
