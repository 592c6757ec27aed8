"""canonical_json's fast path (orjson) writes exactly what the json module writes with the same
options, value by value: a revision's hash and a prompt's text never depend on which one wrote it."""

import json
from collections import OrderedDict

import pytest

from ledger.models import canonical_json

SLOW = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"))

VALUES = [
    "plain",
    "",
    'quote " backslash \\ slash / tab \t newline \n nul \x00 escape \x1b del \x7f',
    "é ß 中文 \u2028 \u2029 \ufeff \uffff \U0001f600",
    0,
    -1,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    2**64,
    -(2**63) - 1,
    10**40,
    True,
    False,
    None,
    [],
    {},
    [1, "a", None, True, [[], {}]],
    {"b": 1, "a": 2, "B": 3, "é": 4, "e": 5, "\U0001f600": 6, "\uffff": 7, "": 8, "10": 9, "9": 10},
    {"z": {"y": [{"b": 1, "a": [2, {"d": 4, "c": 3}]}]}},
    {"materials": ["oak", "steel"], "dimensions": {"w_cm": 57, "h_cm": 66}},
    ("a", "tuple"),
    OrderedDict([("b", 1), ("a", 2)]),
    1.5,
    1e16,
    1e-7,
    -0.0,
    float("nan"),
    float("inf"),
    {"price": 12.5, "name": "x"},
    [1, [2, [3.25]]],
    "lone \ud800 surrogate",
    {"key \udfff": 1},
    {1: "integer key", 2: "two"},
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_the_fast_rendering_is_the_json_modules(value):
    assert canonical_json(value) == SLOW.encode(value)


def test_what_neither_can_write_is_refused_alike():
    for value in [{"a": object()}, {1: 1, "1": 2, None: 3}, b"bytes"]:
        with pytest.raises(TypeError):
            SLOW.encode(value)
        with pytest.raises(TypeError):
            canonical_json(value)
