"""A results download is cut into lines by `jsonl_lines`: at newlines only, wherever the network
cut the chunks, read as UTF-8 the way httpx reads text."""

import json

import pytest

from ledger.providers.http import jsonl_lines

TEXT = (
    json.dumps({"custom_id": "bd-1-1", "text": "line\u2028separator and form\x0cfeed"}, ensure_ascii=False)
    + "\r\n"
    + json.dumps({"custom_id": "bd-2-1", "text": "é ü 漢字 😀"}, ensure_ascii=False)
    + "\n\n"
    + '{"custom_id": "bd-3-1", "text": "no newline at the end"}'
).encode()


def cut(data: bytes, every: int) -> list[bytes]:
    return [data[start : start + every] for start in range(0, len(data), every)]


@pytest.mark.parametrize("every", [1, 2, 3, 7, 64, len(TEXT)])
def test_lines_are_the_same_wherever_the_chunks_are_cut(every):
    assert list(jsonl_lines(cut(TEXT, every))) == [
        json.dumps(
            {"custom_id": "bd-1-1", "text": "line\u2028separator and form\x0cfeed"}, ensure_ascii=False
        ),
        json.dumps({"custom_id": "bd-2-1", "text": "é ü 漢字 😀"}, ensure_ascii=False),
        "",
        '{"custom_id": "bd-3-1", "text": "no newline at the end"}',
    ]


def test_a_line_ending_in_a_newline_adds_no_empty_line_and_nothing_gives_nothing():
    assert list(jsonl_lines([b'{"a": 1}\n'])) == ['{"a": 1}']
    assert list(jsonl_lines([])) == []
    assert list(jsonl_lines([b""])) == []


def test_bytes_that_are_not_utf8_read_as_replacement_characters_as_httpx_reads_them():
    data = b'{"text": "caf\xe9"}\n'
    assert list(jsonl_lines(cut(data, 5))) == [data[:-1].decode("utf-8", "replace")]
    assert "\ufffd" in next(jsonl_lines([data]))
