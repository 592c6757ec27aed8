"""Thousands of values sent as one parameter (`ledger.database.setwise`): what the server reads is exactly
the list, whatever the texts hold."""

import psycopg
import pytest
from django.db import connection

from ledger.database.setwise import (
    among,
    packed_bytes,
    packed_ints,
    packed_texts,
    text_array,
    with_packed_arrays,
)
from ledger.models import Product
from tests.factories import ProductFactory

pytestmark = [pytest.mark.django_db, pytest.mark.postgresql_only]

AWKWARD_TEXTS = [
    "plain",
    "",
    " padded ",
    "NULL",
    "null",
    'say "hi"',
    "back\\slash",
    '\\"',
    '","',
    "{braces}",
    "a,b",
    "tab\there",
    "new\nline",
    "naïve – 漢字 🚲",
    '{"json": ["a", 1, {"b": null}]}',
]


def server_reads(sql: str, params: list, *, packed: bool = False) -> list:
    with psycopg.Cursor(connection.connection) as cursor:
        if packed:
            with_packed_arrays(cursor)
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


@pytest.mark.parametrize("texts", [AWKWARD_TEXTS, [], ["only"], ['"'], ["\\"]])
def test_a_text_array_literal_reads_back_as_the_list(texts):
    connection.ensure_connection()
    assert server_reads("SELECT %s::text[]", [text_array(texts)]) == texts


@pytest.mark.parametrize("texts", [AWKWARD_TEXTS, [], ["only"], [None], ["a", None, '"', None]])
def test_packed_texts_read_back_as_the_list(texts):
    connection.ensure_connection()
    assert server_reads("SELECT %b::text[]", [packed_texts(texts)], packed=True) == texts


def test_packed_bytes_read_back_as_the_list():
    values = [b"", b"\x00\xff", bytes(range(256)), None, b"\\x41"]
    connection.ensure_connection()
    assert server_reads("SELECT %b::bytea[]", [packed_bytes(values)], packed=True) == values


@pytest.mark.parametrize("ids", [[], [1], [3, 1, 2, 1], [-(2**63), 2**63 - 1, 0]])
def test_packed_ints_read_back_as_the_list(ids):
    connection.ensure_connection()
    assert server_reads("SELECT %b::bigint[]", [packed_ints(ids)], packed=True) == ids


def test_a_text_holding_nul_is_refused_not_split():
    with pytest.raises(ValueError, match="NUL"):
        text_array(["a\x00b", "c"])


def test_skus_sent_as_one_parameter_find_what_a_list_of_them_finds():
    skus = ["A-1", 'B"2', "C\\3", "D,4", "{E5}"]
    for sku in skus:
        ProductFactory(sku=sku)
    ProductFactory(sku="OTHER")
    wanted = [*skus, "MISSING"]
    assert sorted(Product.objects.filter(among("sku", wanted)).values_list("sku", flat=True)) == sorted(skus)
    assert sorted(Product.objects.filter(sku__in=wanted).values_list("sku", flat=True)) == sorted(skus)
