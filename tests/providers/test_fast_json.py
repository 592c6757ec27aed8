"""Result lines and drafts are read by jiter when it can (by the json module
otherwise): what is read, or the error raised, is exactly what `json.loads` gives, text by text
(the fast path against the slow one)."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.drafts.validation import read_json
from ledger.providers.http import _finite, loads

TEXTS = [
    '{"custom_id": "bd-1-1", "response": {"status_code": 200, "body": {"usage": {"prompt_tokens": 116}}}}',
    '{"a": "x\\ny", "b": "\\u00e9\\ud83d\\ude00", "c": [1, -0, -0.0, 0.1, 1E-5, 1.7976931348623157e308]}',
    '{"a": 1, "a": 2}',
    '{"big": 100000000000000000000000000000000000000000001, "small": 1e-99}',
    '{"a": 1e999}',
    '{"a": -1E+400, "b": 1.5e308}',
    '{"a": 1' + "0" * 320 + ".5}",
    '{"a": 0.' + "0" * 320 + "1}",
    '{"a": 1' + "0" * 250 + 'e60, "b": 12.5e307, "c": 0.000001e314, "d": 1e+308, "e": 9e-400}',
    '{"a": 17E307}',
    '{"a": ' + "9" * 250 + "e99}",
    '{"a": ' + "9" * 210 + 'E+99, "b": ' + "9" * 199 + ".5e99}",
    '{"id": "batch_req_5e42f", "custom_id": "bd-7e12-1", "v": 3e5}',
    '{"a": NaN, "b": Infinity, "c": -Infinity}',
    '{"a": "\\ud800"}',
    '{"a": "text about e100 and 2e308"}',
    '{"a": "é"}',
    ' {"a": [] } \r\n',
    '"just a string"',
    "123",
    "",
    '{"a": 1,}',
    "{'a': 1}",
    '{"a": "x\ny"}',
    '{"a": 01}',
    '{"a": 1.}',
    '{"a": "\x00"}',
    "\ufeff{}",
    '{"a": 1} trailing',
    "[" * 5_000 + "]" * 5_000,
]


def outcome(read, text, *, words: bool = False):
    """What reading `text` gives: the value, or that it is refused (with the error's words: a result
    line's are kept with it)."""
    try:
        return "read", repr(read(text))  # repr: NaN equals NaN, -0.0 differs from 0
    except RecursionError:
        return "too deep", None
    except ValueError as exc:
        return "refused", str(exc) if words else None


@pytest.mark.parametrize("text", TEXTS, ids=lambda text: text[:40])
def test_a_result_line_reads_as_the_json_module_reads_it_with_non_finite_numbers_null(text):
    def reference(text):  # what `loads` did before its decoder was shared
        try:
            return json.loads(text, parse_constant=lambda name: None, parse_float=_finite)
        except RecursionError:
            # Since issue 17: a line nested deeper than Python reads is unreadable, like one that
            # is not JSON, instead of an exception that ended the whole collection.
            raise ValueError("nested too deeply to read") from None

    assert outcome(loads, text, words=True) == outcome(reference, text, words=True)


@pytest.mark.parametrize("text", TEXTS, ids=lambda text: text[:40])
def test_a_draft_reads_as_the_json_module_reads_it(text):
    assert outcome(read_json, text) == outcome(json.loads, text)


def test_what_a_result_line_keeps_is_json_a_database_stores():
    read = loads('{"usage": {"a": 1e999, "b": NaN, "c": 2.5, "d": 1' + "0" * 400 + "}}")
    assert read == {"usage": {"a": None, "b": None, "c": 2.5, "d": 10**400}}
    assert all(not isinstance(value, float) or math.isfinite(value) for value in read["usage"].values())


@settings(max_examples=400, deadline=None)
@given(
    whole=st.integers(min_value=1, max_value=400),
    fraction=st.integers(min_value=0, max_value=30),
    exponent=st.one_of(
        st.none(), st.integers(min_value=-120, max_value=120), st.integers(min_value=-500, max_value=500)
    ),
    sign=st.sampled_from(["", "-"]),
    marker=st.sampled_from(["e", "E", "e+", "e0", "E+00"]),
)
def test_any_number_however_long_or_large_reads_as_the_json_module_reads_it(
    whole, fraction, exponent, sign, marker
):
    # Only text that may hold an overflowing number has its values walked for infinities: a number
    # of any length, with any exponent, must still read as the reference reads it.
    number = sign + "9" * whole + ("." + "5" * fraction if fraction else "")
    if exponent is not None:
        number += (marker if exponent >= 0 else "e") + str(exponent)
    text = '{"usage": {"tokens": ' + number + '}, "note": "e100"}'
    reference = json.loads(text, parse_constant=lambda name: None, parse_float=_finite)
    assert outcome(loads, text, words=True) == ("read", repr(reference))
