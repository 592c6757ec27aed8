"""What a JSON value may hold to be stored and sent (SPEC §7): the rules the catalogue importer, the
API and prompt versions share. The ground floor: it imports nothing of the ledger.

PostgreSQL's jsonb holds no NUL, a lone surrogate (JSON "\\ud800") cannot be encoded at all, JSON
has no NaN, and nesting is bounded so that every reader of a value (hashing, prompts, screens)
stays far from Python's recursion limit.
"""

import json
import math
from typing import NoReturn

# How deep lists and objects may nest in a field's value: `"features": ["LED"]` is 1 deep,
# `"sizes": [{"w_cm": 30}]` 2. Real catalogues need 2 or 3; the limit keeps every reader of a
# value (hashing, prompts, screens) far from Python's recursion limit.
MAX_FIELD_DEPTH = 8

type JsonValue = str | int | float | bool | None | list[JsonValue] | dict[str, JsonValue]
# A product field: text, a number, true/false, or a list or object of JSON values (SPEC §7).
type FieldValue = str | int | float | bool | list[JsonValue] | dict[str, JsonValue]


class InvalidJson(ValueError):
    """JSON that Python would read but the ledger refuses: a key twice, NaN or Infinity."""


def unique_json_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """`json.loads`'s object_pairs_hook: a key given twice is refused, not silently the last one."""
    data: dict[str, object] = {}
    for key, value in pairs:
        if key in data:
            raise InvalidJson(f'the key "{key}" appears twice')
        data[key] = value
    return data


def refuse_json_constant(name: str) -> NoReturn:
    """`json.loads`'s parse_constant: NaN, Infinity and -Infinity are not JSON numbers."""
    raise InvalidJson(f"not valid JSON ({name} is not a number)")


def text_problem(value: str) -> str | None:
    """Why a text cannot be stored (PostgreSQL cannot store NUL, a lone surrogate cannot be
    encoded), or None."""
    if "\x00" in value:
        return "contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an unpaired surrogate escape"
    return None


def shown(value: str) -> str:
    """A text quoted in a problem's words, cut at 70 characters."""
    return json.dumps(value if len(value) <= 70 else value[:70] + "…", ensure_ascii=False)


def json_value_problem(value: object, field: str, *, max_depth: int = MAX_FIELD_DEPTH) -> str | None:
    """Why `value` cannot be stored as `field` (jsonb holds no NUL, JSON no NaN), or None."""
    return _value_problem(value, field, where=field, depth=0, max_depth=max_depth)


def _value_problem(value: object, field: str, *, where: str, depth: int, max_depth: int) -> str | None:
    if isinstance(value, str):
        problem = text_problem(value)
        return f"{where} {problem}" if problem else None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where} is not a finite number"
    if value is None or isinstance(value, bool | int):
        return None
    if not isinstance(value, list | dict):
        return f"{where} is not a JSON value"
    if depth == max_depth:
        return f"{field} nests lists and objects more than {max_depth} deep"
    if isinstance(value, list):
        for position, inner in enumerate(value, start=1):
            if problem := _value_problem(
                inner, field, where=f"{where}, item {position}", depth=depth + 1, max_depth=max_depth
            ):
                return problem
        return None
    for key, inner in value.items():
        if not isinstance(key, str) or (problem := text_problem(key)) is not None:
            return f"{where} has a key that {problem or 'is not text'}"
        if problem := _value_problem(
            inner, field, where=f"{where}, key {shown(key)}", depth=depth + 1, max_depth=max_depth
        ):
            return problem
    return None
