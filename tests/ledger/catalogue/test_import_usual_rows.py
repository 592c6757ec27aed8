"""The import reads a usual JSONL row in a few C calls (`usual_row`) and leaves anything unusual to
the full reading it replaces for those rows. Whatever it accepts must be staged exactly as the full
reading stages it: the same record, the same content hash, the same fields; and a whole file must
read the same either way, refusals and their words included."""

import copy
import io
import json

import jiter
import orjson
import pytest

from ledger.catalogue import Rejection, checks, digests, read_catalogue, reading, records, usual_rows
from ledger.models import SourceRevision

TRICKY_LINES = [
    '{"sku": "A-1", "title": "Lamp", "features": ["LED", "dimmable"], "dimensions": {"w_cm": 30}}',
    '{"sku":"A-2","title":"  Padded title  ","colour":"  sage  ","empty":"","none":null,"zero":0}',
    '{"sku": "A-3", "title": "Time: 10:30", "note": "a: b: c", "url": "https://example.com:8080/x"}',
    '{"sku": "A-4", "title": "Dup", "colour": "red", "colour": "blue"}',
    '{"sku": "A-5", "title": "Nested dup", "dimensions": {"w_cm": 30, "w_cm": 31}}',
    '{"sku": "A-6", "title": "Escaped colon", "a\\u003ab": 1, "a:b": 2}',
    '{"sku": "A-7", "title": "Escaped colon value", "k": "x\\u003Ay"}',
    '{"sku": "A-8", "title": "Not a number", "price": NaN}',
    '{"sku": "A-9", "title": "Infinite", "price": Infinity}',
    '{"sku": "A-10", "title": "Huge", "price": 1e400}',
    '{"sku": "A-11", "title": "NUL in value", "k": "a\\u0000b"}',
    '{"sku": "A-12", "title": "NUL\\u0000 in title"}',
    '{"sku": "A-13", "title": "Surrogate \\ud800"}',
    '{"sku": "A-14", "title": "Surrogate in field", "k": ["\\udfff"]}',
    '{"sku": "A-15", "title": "Key surrogate", "\\ud800": 1}',
    '{"sku": "A-16", "title": "Deep", "k": [[[[[[[[["nine"]]]]]]]]]}',
    '{"sku": "A-17", "title": "Eight brackets in text", "k": "[[[[{{{{"}',
    '{"sku": "A-18", "title": "' + "x" * 301 + '"}',
    '{"sku": "A-19", "title": "   "}',
    '{"sku": "A-20", "title": "Status", "status": " Withdrawn "}',
    '{"sku": "A-21", "title": "Status", "status": "ACTIVE"}',
    '{"sku": "A-22", "title": "Status", "status": "gone"}',
    '{"sku": "A-23", "title": "Status", "status": 5}',
    '{"sku": "A-24", "title": "Status", "status": null}',
    '{"sku": "A-25", "title": "Status", "status": ""}',
    '{"sku": " A-26 ", "title": "Padded sku"}',
    '{"sku": "bad sku", "title": "Bad"}',
    '{"sku": 27, "title": "Number sku"}',
    '{"sku": "A-28", "title": 28}',
    '{"sku": "A-29", "title": "Padded key", " colour": "red"}',
    '{"sku": "A-30", "title": "Empty key", "": "red"}',
    '{"sku": "A-31", "title": "Key clash", "colour": "red", "colour ": "blue"}',
    '["A-32", "a list"]',
    '"A-33"',
    '{"sku": "A-34", "title": "Unicode \u00e9\u00e8 \U0001f600 \\u00e9", "k": "caf\\u00e9", "\u00fcber": true}',
    '{"sku": "A-35", "title": "Quotes \\"here\\"", "k": "back\\\\slash", "tab": "a\\tb"}',
    '{"sku": "A-36", "title": "Numbers", "a": 1, "b": 1.0, "c": -0.0, "d": 12345678901234567890, "e": 1e-7}',
    '{"sku": "A-37", "title": "Booleans", "a": true, "b": false, "c": [true, null, ""]}',
    '{"sku": "A-1", "title": "Repeated sku"}',
    '{"sku": "A-38", "title": "Sku twice", "sku": "A-39"}',
    '{"sku": "A-40", "title": "Title twice", "title": "Other"}',
    '{"sku": "A-41", "title": "Status twice", "status": "active", "status": "withdrawn"}',
    '{"sku": "A-42", "title": "Big int", "k": ' + "9" * 5000 + "}",
    '{"sku": "A-43", "title": "Whitespace", "k" :  "v" ,  "l":[ 1 , 2 ] }',
    '{"sku": "A-44", "title": "Null dup", "k": null, "k": "v"}',
    '{"sku": "A-45", "title": "Blank dup", "k": "", "k": "v"}',
    '{"sku": "A-46", "title": "Colon key", "a:b": {"c:d": "e:f"}}',
    "{oops",
    "",
    "   ",
    '{"sku": "A-47", "title": "Trailing"}   ',
    '{"sku": "A-48", "title": "Objects in lists", "variants": [{"colour": "grey", "stock": 3}, {"colour": "red"}]}',
    '{"sku": "A-49", "title": "Floats", "a": 0.1, "b": 1e16, "c": 1.7976931348623157e308, "d": 5e-324, '
    '"e": 123456789.123456789, "f": 1E+2, "g": -1.5e-10, "h": 2.2250738585072011e-308, "i": 0.30000000000000004}',
    '{"sku": "A-50", "title": "Escapes", "k": "\\u00e9 \\n \\/ \\b\\f\\r \\u001f \\u2028 end", "l": "\\ud83d\\ude00"}',
    '{"sku": "A-51", "title": "Trailing comma", "k": 1,}',
    '{"sku": "A-52", "title": "Extra"} {"x": 1}',
    '{"sku": "A-53", "title": "Floats in lists", "k": [ 1, 2 ,\t-3.5e3 ], "l": [1E5], "m": {"n":\n0.5}}',
    '{"sku": "A-54", "title": "Huge ints", "k": 123456789012345678901234567890, "l": -9223372036854775809}',
    '{"sku": "A-55", "title": "Looks like 1.5: a float", "k": "x: 2.5", "l": ["1e5", 7]}',
]


def _values(value):
    yield value
    for inner in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
        yield from _values(inner)


def full_reading(line: records.Line, seen: digests.SeenSkus):
    rows = list(reading._read_jsonl((line,)))
    assert len(rows) <= 1
    if not rows:
        return None
    row = rows[0]
    return records._staged(row if isinstance(row, Rejection) else checks.check_record(*row, seen))


def as_line(number: int, text: str) -> records.Line:
    return records.Line(number, text + "\n", len(text.encode("utf-8", "surrogatepass")), None)


def test_every_row_it_accepts_is_staged_as_the_full_reading_stages_it():
    seen = digests.SeenSkus()  # the SKUs of the lines before, as the full reading knows them
    accepted = 0
    for number, text in enumerate(TRICKY_LINES, start=1):
        line = as_line(number, text)
        usual = usual_rows.usual_row(line, copy.deepcopy(seen))
        full = full_reading(line, seen)
        if usual is None:
            continue
        accepted += 1
        if isinstance(full, Rejection):
            assert usual == full, text
            continue
        assert usual.record == full.record, text
        assert usual.content_hash == full.content_hash, text
        assert usual.content_hash == SourceRevision.hash_content(full.record.title, full.record.fields)
        assert json.loads(usual.fields) == json.loads(full.fields), text
    # Most real rows take the quick way; the test is void if none did.
    assert accepted >= 12


@pytest.mark.parametrize(
    "text",
    [
        '{"sku": "A-4", "title": "Dup", "colour": "red", "colour": "blue"}',
        '{"sku": "A-5", "title": "Nested dup", "dimensions": {"w_cm": 30, "w_cm": 31}}',
        '{"sku": "A-38", "title": "Sku twice", "sku": "A-39"}',
        '{"sku": "A-44", "title": "Null dup", "k": null, "k": "v"}',
        '{"sku": "A-6", "title": "Escaped colon", "a\\u003ab": 1, "a:b": 2}',
        '{"sku": "A-8", "title": "Not a number", "price": NaN}',
        '{"sku": "A-10", "title": "Huge", "price": 1e400}',
        '{"sku": "A-13", "title": "Surrogate \\ud800"}',
        '{"sku": "A-16", "title": "Deep", "k": [[[[[[[[["nine"]]]]]]]]]}',
    ],
)
def test_what_it_cannot_vouch_for_goes_the_full_way(text):
    assert usual_rows.usual_row(as_line(1, text), digests.SeenSkus()) is None


def test_a_whole_file_reads_the_same_with_and_without_the_quick_way(monkeypatch):
    content = ("\n".join(TRICKY_LINES) + "\n").encode("utf-8", "surrogatepass")

    quick = list(read_catalogue(io.BytesIO(content)))
    monkeypatch.setattr(reading, "usual_row", lambda line, seen, keep_fields=True: None)
    full = list(read_catalogue(io.BytesIO(content)))

    assert quick == full
    assert any(isinstance(row, Rejection) for row in full) and any(
        not isinstance(row, Rejection) for row in full
    )


@pytest.mark.parametrize(
    "value",
    [
        {"b": 1, "a": [1.5, -0.0, 1e16, 5e-324, True, None, 'ünï\u2028\x1f"\\'], "c": {"z": {}, "y": []}},
        {"\U0001f600": 12345678901234567890, "": 0.1},
        [],
        "text",
    ],
)
def test_the_canonical_encoder_made_once_renders_as_the_encoder_it_stands_for(value):
    assert usual_rows._canonical(value) == usual_rows._CANONICAL.encode(value)


@pytest.mark.parametrize(
    ("value", "error"),
    [({"a": float("nan")}, ValueError), ({"a": float("inf")}, ValueError), ({"a": {1, 2}}, TypeError)],
)
def test_the_canonical_encoder_made_once_refuses_what_the_encoder_refuses(value, error):
    with pytest.raises(error):
        usual_rows._CANONICAL.encode(value)
    with pytest.raises(error):
        usual_rows._canonical(value)


@pytest.mark.parametrize("keep_fields", [True, False], ids=["fields-kept", "fields-let-go"])
@pytest.mark.parametrize("text", [line for line in TRICKY_LINES if line.startswith("{")])
def test_a_rows_fields_are_rendered_as_the_json_module_renders_them(text, keep_fields):
    usual = usual_rows.usual_row(as_line(1, text), digests.SeenSkus(), keep_fields)
    if not isinstance(usual, records.Staged):
        return
    fields = {
        key: value
        for key, value in json.loads(text).items()
        if key not in checks.NOT_FIELDS and value is not None and value != ""
    }
    assert usual.fields == usual_rows._canonical(fields), text
    assert usual.record.fields == (fields if keep_fields else None), text


@pytest.mark.parametrize(
    "text",
    [
        '{"sku": "A-36", "title": "Numbers", "a": 1, "b": 1.0, "c": -0.0, "d": 12345678901234567890, "e": 1e-7}',
        next(line for line in TRICKY_LINES if '"A-49"' in line),
        '{"sku": "A-53", "title": "Floats in lists", "k": [ 1, 2 ,\t-3.5e3 ], "l": [1E5], "m": {"n":\n0.5}}',
        '{"sku": "A-56", "title": "Float and huge int", "k": 0.5, "l": 123456789012345678901234567890}',
    ],
)
def test_a_row_holding_floats_still_takes_the_quick_way_with_python_floats(text):
    usual = usual_rows.usual_row(as_line(1, text), digests.SeenSkus())
    let_go = usual_rows.usual_row(as_line(1, text), digests.SeenSkus(), keep_fields=False)

    assert isinstance(usual, records.Staged), text
    assert all(type(value) is not jiter.LosslessFloat for value in _values(usual.record.fields)), text
    assert let_go == usual._replace(record=usual.record._replace(fields=None)), text


@pytest.mark.parametrize(
    "value", ["0.1", "1e16", "-0.0", "5e-324", "1.7976931348623157e308", "2.2250738585072011e-308", "1E+2"]
)
def test_a_float_read_as_written_is_rendered_as_the_json_module_renders_it(value):
    read = jiter.from_json(value.encode(), float_mode="lossless-float")

    assert (
        orjson.dumps([read], default=usual_rows._float_as_json)
        == json.dumps([json.loads(value)]).replace(" ", "").encode()
    )


@pytest.mark.parametrize("value", ["1e400", "-1e400"])
def test_a_float_beyond_the_finite_is_refused(value):
    with pytest.raises(TypeError):  # orjson.JSONEncodeError, as the json module refuses infinity
        orjson.dumps(
            jiter.from_json(value.encode(), float_mode="lossless-float"), default=usual_rows._float_as_json
        )
