"""Rows written by the database from other rows (`INSERT … SELECT`), with the values Django itself
would have given every column it is not told about: nothing per row passes through Python."""

import json
import struct
from collections.abc import Mapping, Sequence
from functools import cache
from itertools import chain, repeat

import psycopg
from django.db import connections, models, router
from django.db.models import F
from django.db.models.expressions import RawSQL
from django.db.models.lookups import In
from psycopg.adapt import Dumper
from psycopg.pq import Format


def insert_from_select(
    model: type[models.Model],
    *,
    select: Mapping[str, str],
    values: Mapping[str, object] | None = None,
    from_sql: str,
    params: Sequence = (),
    with_: Mapping[str, tuple[str, Sequence]] | None = None,
) -> int:
    """`INSERT INTO <model's table> (…) SELECT … FROM <from_sql>`; returns the number of rows written.

    `with_` names statements (from `insert_select_sql`, or any query with its params) that
    `from_sql` reads as tables: `WITH name AS (…) INSERT …`, one statement. An `INSERT … RETURNING`
    there writes its rows in the same statement, and the database hands its returned rows on
    without their passing through Python or being read again.
    """
    sql, args = insert_select_sql(model, select=select, values=values, from_sql=from_sql, params=params)
    if with_:
        sql = "WITH " + ", ".join(f"{name} AS ({query})" for name, (query, _) in with_.items()) + " " + sql
        args = [*(arg for _, query_args in with_.values() for arg in query_args), *args]
    connection = connections[router.db_for_write(model)]
    with connection.cursor() as cursor:
        cursor.execute(sql, args)
        return cursor.rowcount


def insert_select_sql(
    model: type[models.Model],
    *,
    select: Mapping[str, str],
    values: Mapping[str, object] | None = None,
    from_sql: str,
    params: Sequence = (),
    returning: Sequence[str] = (),
) -> tuple[str, list]:
    """The SQL and params of `insert_from_select`, unexecuted; `returning` names the columns of the
    written rows it gives back (`RETURNING`), for another statement to read with `with_`.

    `select` maps field names to SQL expressions over `from_sql` (one value per row); `values`
    maps field names to one Python value for every row (a related object or its key for a foreign
    key). Every other field gets what `Model.save()` would give it, taken from the model's
    `_meta`: its default, `auto_now`/`auto_now_add` time, or empty text; a field with only a
    database default is left to the database. `from_sql` is everything after FROM (joins, WHERE,
    ORDER BY: the order rows get their ids in), with `%s` for each of `params`.
    """
    values = dict(values or {})
    opts = model._meta
    fields = {f.name: f for f in opts.concrete_fields}
    if wrong := sorted((set(select) | set(values)) - set(fields) | (set(select) & set(values))):
        raise ValueError(f"{opts.label}: fields unknown or given twice: {', '.join(wrong)}")
    connection = connections[router.db_for_write(model)]
    # One unsaved row holds what Django would insert; each field is read from it as save() does.
    template = model(
        **{
            name
            if isinstance(value, models.Model) or not fields[name].is_relation
            else fields[name].attname: value
            for name, value in values.items()
        }
    )
    columns, expressions, constants = [], [], []
    for field in opts.concrete_fields:
        if field is opts.auto_field or field.generated:
            continue
        if field.name in select:
            expressions.append(select[field.name])
        elif field.name not in values and not field.has_default() and field.has_db_default():
            continue
        else:
            value = field.get_db_prep_save(field.pre_save(template, add=True), connection)
            if value is None and not field.null:
                raise ValueError(f"{opts.label}.{field.name} has no default: give it in select or values")
            expressions.append("%s")
            constants.append(value)
        columns.append(connection.ops.quote_name(field.column))
    sql = (
        f"INSERT INTO {connection.ops.quote_name(opts.db_table)} ({', '.join(columns)}) "
        f"SELECT {', '.join(expressions)} FROM {from_sql}"
    )
    if returning:
        sql += f" RETURNING {', '.join(connection.ops.quote_name(column) for column in returning)}"
    return sql, [*constants, *params]


def next_id_sql(model: type[models.Model]) -> str:
    """SQL giving the next id of the model's table from its own sequence (PostgreSQL), so rows can
    be given their ids before they are written, and what refers to them written without reading
    them back."""
    return f"nextval('{_id_sequence(router.db_for_write(model), model._meta.db_table)}'::regclass)"


@cache
def _id_sequence(alias: str, table: str) -> str:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
        return cursor.fetchone()[0]


def ids_query(ids: Sequence[int], *, using: str = "default") -> RawSQL:
    """A subquery of the given ids, sent as one parameter, for SQL of one's own (its `.sql` and
    `.params`; in a filter, `among` says the same): an array on PostgreSQL, a JSON list on SQLite. A
    plain `IN` is a placeholder per id, which psycopg lays out one by one in Python; a unit's
    thousands of items cost its send more in that than in the statements themselves."""
    if connections[using].vendor == "postgresql":
        return RawSQL("SELECT unnest(%s::bigint[])", [list(ids)])
    return RawSQL("SELECT value FROM json_each(%s)", [json.dumps(list(ids))])


def text_array(values: Sequence[str]) -> str:
    """A PostgreSQL array literal of these texts, for `%s::text[]`: one literal the server reads
    once (Django's cursor writes it into the statement; a server-bound parameter must be of unknown
    type, not text, or the cast is made again for every row). psycopg dumps a list element by
    element in Python; this is a few passes of C over the joined text. A text holding NUL, which
    PostgreSQL's text cannot, is refused with ValueError."""
    if not values:
        return "{}"
    joined = "\x00".join(values)
    if joined.count("\x00") != len(values) - 1:
        raise ValueError("a text holds NUL, which PostgreSQL's text cannot")
    if "\\" in joined or '"' in joined:
        joined = joined.replace("\\", "\\\\").replace('"', '\\"')
    return '{"' + joined.replace("\x00", '","') + '"}'


class PackedArray(bytes):
    """An array already in PostgreSQL's binary format (`packed_texts`, `packed_bytes`,
    `packed_ints`), sent as it is by a psycopg cursor `with_packed_arrays`: the server reads it with
    no text to parse, and the packing is a few C calls over the whole list where psycopg dumps a
    list element by element in Python."""

    oid = 0


class PackedTexts(PackedArray):
    oid = 1009  # text[]


class PackedBytes(PackedArray):
    oid = 1001  # bytea[]


class PackedInts(PackedArray):
    oid = 1016  # bigint[]


def packed_ints(values: Sequence[int]) -> PackedInts:
    """Integers that fit 64 bits (ids), none of them NULL."""
    count = len(values)
    header = struct.pack(">5i", 1, 0, 20, count, 1)
    return PackedInts(header + struct.pack(">" + "iq" * count, *chain.from_iterable(zip(repeat(8), values))))


def packed_texts(values: Sequence[str | None]) -> PackedTexts:
    return PackedTexts(_packed([None if value is None else value.encode() for value in values], 25))


def packed_bytes(values: Sequence[bytes | None]) -> PackedBytes:
    return PackedBytes(_packed(values, 17))


def _packed(values: Sequence[bytes | None], element_oid: int) -> bytes:
    """One dimension, from 1: its header, then each element's length (-1: NULL) and bytes."""
    count = len(values)
    nulls = values.count(None)
    lengths = struct.pack(f">{count}i", *(-1 if value is None else len(value) for value in values))
    header = struct.pack(">5i", 1, 1 if nulls else 0, element_oid, count, 1)
    if nulls:
        values = [b"" if value is None else value for value in values]
    return header + b"".join(
        chain.from_iterable(zip((lengths[at : at + 4] for at in range(0, 4 * count, 4)), values, strict=True))
    )


def with_packed_arrays(cursor: psycopg.Cursor) -> psycopg.Cursor:
    """The cursor, sending `PackedArray`s as they are (`%b`)."""
    cursor.adapters.register_dumper(PackedTexts, _PackedTextsDumper)
    cursor.adapters.register_dumper(PackedBytes, _PackedBytesDumper)
    cursor.adapters.register_dumper(PackedInts, _PackedIntsDumper)
    return cursor


class _PackedDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: PackedArray) -> bytes:
        return obj


class _PackedTextsDumper(_PackedDumper):
    oid = PackedTexts.oid


class _PackedBytesDumper(_PackedDumper):
    oid = PackedBytes.oid


class _PackedIntsDumper(_PackedDumper):
    oid = PackedInts.oid


class AnyOf(In):
    """`field IN (…)` for thousands of values: on PostgreSQL `= ANY(%s)` with one array
    parameter (a statement of thousands of placeholders costs more to compose than to run)."""

    def as_postgresql(self, compiler, connection):
        values = list(self.rhs)
        if not values:
            return self.as_sql(compiler, connection)  # matches nothing, as `IN` says
        lhs, lhs_params = self.process_lhs(compiler, connection)
        if all(type(value) is int for value in values):
            # Ids: one text parameter, read as an array by the server (psycopg dumps a list
            # element by element).
            return f"{lhs} = ANY(%s::bigint[])", (*lhs_params, "{" + ",".join(map(str, values)) + "}")
        if all(type(value) is str for value in values):
            return f"{lhs} = ANY(%s::text[])", (*lhs_params, text_array(values))
        return f"{lhs} = ANY(%s)", (*lhs_params, values)


def among(field: str, values) -> AnyOf:
    return AnyOf(F(field), list(values))
