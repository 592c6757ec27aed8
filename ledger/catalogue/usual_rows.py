"""The quick way through a usual JSONL row: read and checked in a few C calls, staged exactly as the
full reading would stage it, or handed back to the full reading, which words its problems.
"""

import hashlib
import json
import math
from collections.abc import Callable
from json.encoder import c_make_encoder, encode_basestring
from typing import NoReturn

import jiter
import orjson

from ..drafts.json_values import MAX_FIELD_DEPTH
from .checks import NOT_FIELDS, STATUSES
from .digests import SeenSkus, product_line_digest, sku_digest
from .records import MAX_TITLE_LENGTH, SKU_PATTERN, Line, Record, Rejection, Staged

# models.canonical_json's rendering, refusing what is not JSON (NaN, infinity).
_CANONICAL = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _refuse_to_encode(value: object) -> NoReturn:
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def _canonical_encoder() -> Callable[[object], str]:
    """`_CANONICAL.encode`, without making its C encoder again for every row (a third of its time):
    the same C encoder, made once, with the same settings. No check for cycles: a value just read
    from JSON has none. Python's own encode where there is no C encoder."""
    if c_make_encoder is None:
        return _CANONICAL.encode
    encode = c_make_encoder(
        None,  # markers: no check for cycles
        _refuse_to_encode,
        encode_basestring,  # ensure_ascii=False
        None,  # indent
        _CANONICAL.key_separator,
        _CANONICAL.item_separator,
        _CANONICAL.sort_keys,
        _CANONICAL.skipkeys,
        _CANONICAL.allow_nan,
    )
    return lambda value: "".join(encode(value, 0))


_canonical = _canonical_encoder()


def _float_as_json(value: object) -> orjson.Fragment:
    """orjson's hook for what it cannot write: a float jiter read as written (its LosslessFloat), as
    the json module writes it (Python's shortest repr); a float beyond the finite is refused."""
    if type(value) is not jiter.LosslessFloat:
        raise TypeError(f"{type(value).__name__} is not a JSON value")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError("not a finite number")
    return orjson.Fragment(float.__repr__(number))


def usual_row(
    line: Line, seen: "SeenSkus", keep_fields: bool = True, *, floats_read: bool = False
) -> Staged | Rejection | None:
    """A usual JSONL row read and checked in a few C calls: staged exactly as `_read_jsonl` and
    `check_record` would stage it (same record, fields and hash), or its one problem, a SKU seen before.
    None for anything unusual, which the full reading then reads and words.

    Its fields are rendered by orjson, which writes any JSON value as the json module does but a
    float (1e16, not 1e+16). So a float is read as jiter's LosslessFloat, which orjson hands to
    `_float_as_json`. A row orjson cannot write (an integer beyond 64 bits, nesting deeper than
    orjson goes, or, where the fields are kept and must hold Python floats, a float) is read again
    with `floats_read`, as Python floats, and rendered by the json module.

    Python's json keeps the last of two equal keys without a word, so they are found by counting:
    every `:` of the line is a key's or inside a text, and the record rebuilt from what was read
    holds as many unless a key was dropped. An escaped colon (\\u003a) would upset the count, so
    such a line, like NaN and Infinity, goes the full way."""
    text = line.text
    if "\\u003" in text or "NaN" in text or "Infinity" in text:
        return None
    try:
        # jiter reads what Python's json reads, alike, about twice as fast; what it refuses (a lone
        # surrogate escape, say) goes the full way, which words it.
        data = jiter.from_json(
            text.encode(), cache_mode="keys", float_mode="float" if floats_read else "lossless-float"
        )
    except (ValueError, RecursionError, UnicodeEncodeError):
        return None
    if type(data) is not dict:
        return None
    sku, title, status = data.get("sku"), data.get("title"), data.get("status")
    if type(sku) is not str or not SKU_PATTERN.fullmatch(sku) or type(title) is not str:
        return None
    title = title.strip()
    if not title or len(title) > MAX_TITLE_LENGTH or "\x00" in title:
        return None
    if status is not None:
        if type(status) is not str:
            return None
        status = status.strip().lower() or None
        if status is not None and status not in STATUSES:
            return None
    # Every other key is a field. The checks are whole-list operations (done in C): a padded or
    # blank key or text is left to the full reading; null and "" are left out, as it leaves them.
    fields = {key: value for key, value in data.items() if key not in NOT_FIELDS}
    keys = list(fields)
    texts = [value for value in fields.values() if type(value) is str]
    if "" in keys or list(map(str.strip, keys)) != keys:
        return None
    # Colons of the line that the fields' canonical rendering below will not hold.
    colons = sum(1 + value.count(":") if type(value) is str else 1 for value in (sku, title, status)) - sum(
        key not in data for key in NOT_FIELDS
    )
    cleared: tuple[str, ...] = ()
    if None in fields.values() or "" in texts:
        cleared = tuple(key for key, value in fields.items() if value is None or value == "")
        for key in cleared:
            colons += 1 + key.count(":")
            del fields[key]
        texts = [value for value in texts if value]
    if list(map(str.strip, texts)) != texts:
        return None
    try:
        if floats_read:
            rendered = _canonical(fields)
        else:
            # Rows whose fields are not kept have their floats written as the json module writes
            # them, by orjson's hook; kept fields must hold Python floats, so they are read again.
            hook = None if keep_fields else _float_as_json
            rendered = orjson.dumps(fields, default=hook, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # orjson.JSONEncodeError is one
        return None if floats_read else usual_row(line, seen, keep_fields, floats_read=True)
    except (ValueError, RecursionError):
        return None
    if (
        text.count(":") != rendered.count(":") + colons
        or rendered.count("[") + rendered.count("{") > MAX_FIELD_DEPTH
        or "\\u0000" in rendered
    ):
        return None
    # canonical_json({"title": …, "fields": …}) without rendering the fields twice.
    content = f'{{"fields":{rendered},"title":{encode_basestring(title)}}}'
    try:
        digest = hashlib.sha256(content.encode("utf-8")).hexdigest()
    except UnicodeEncodeError:  # an unpaired surrogate
        return None
    sku_number = sku_digest(sku.encode())  # once, for both
    if (first := seen.first_line_of(sku_number, line.number)) is not None:
        return Rejection(line.number, f'sku "{sku}" appears again (first on line {first})')
    stored = product_line_digest(line.digest, sku_number) if line.digest else None
    return Staged(
        Record(line.number, sku, title, status, fields if keep_fields else None, cleared),
        rendered,
        digest,
        stored,
    )
