"""Rows written by the database from other rows (`INSERT … SELECT`), with the values Django itself
would have given every column it is not told about: nothing per row passes through Python."""

from collections.abc import Mapping, Sequence

from django.db import connections, models, router


def insert_from_select(
    model: type[models.Model],
    *,
    select: Mapping[str, str],
    values: Mapping[str, object] | None = None,
    from_sql: str,
    params: Sequence = (),
) -> int:
    """`INSERT INTO <model's table> (…) SELECT … FROM <from_sql>`; returns the number of rows written.

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
    with connection.cursor() as cursor:
        cursor.execute(sql, [*constants, *params])
        return cursor.rowcount
