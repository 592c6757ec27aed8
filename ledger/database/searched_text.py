"""What the catalogue search reads of a revision: its title and the text of its fields (each text
value, and each text in a list: not numbers, nor what an object holds), without accents and in
upper case (`Crème` is found by `creme`), as the database function `bd_searched`
computes it (migration 0056, with a trigram index on it).

On PostgreSQL the function (kept in a column of its own) unaccents with the `unaccent` extension (a trusted extension since
PostgreSQL 13: the database's owner creates it, no superuser needed) and upper-cases; the text
searched for goes through the same two steps in the database (`searchable`), so both always agree.
SQLite, the demo's database, has no such extension: each connection is given the same function
written in Python (accents removed by Unicode decomposition, and the letters decomposition leaves
alone mapped as `unaccent` maps them)."""

import json
import unicodedata

from django.db import connection
from django.db.models import Func, TextField

# The fields' values follow the title after this character, so that no text the person types runs
# from one into the other.
SEPARATOR = "\x1f"
# Letters without a decomposition that `unaccent` still maps (its rules file), upper case.
_PLAIN = str.maketrans({"ß": "SS", "Æ": "AE", "Œ": "OE", "Ø": "O", "Ł": "L", "Đ": "D", "Þ": "TH", "Ð": "D"})


class Searched(Func):
    """`bd_searched(title, fields)`: a revision's text as the search reads it. On PostgreSQL, the
    column `searched` the database keeps to it, beside the title named (migration 0056); the model
    does not declare it, so that nothing ever writes it."""

    function = "bd_searched"
    output_field = TextField()

    def as_postgresql(self, compiler, connection, **extra):
        title, params = compiler.compile(self.get_source_expressions()[0])  # "<table or alias>"."title"
        table, column = title.rsplit(".", 1)
        assert column == '"title"', title
        return f'{table}."searched"', params


def plain_upper(text: str) -> str:
    """`text` upper case, accents removed (SQLite's `bd_searched` and `searchable`)."""
    decomposed = unicodedata.normalize("NFKD", text.upper())
    return "".join(c for c in decomposed if not unicodedata.combining(c)).translate(_PLAIN)


def texts_of(fields: dict) -> list[str]:
    """The text a product's fields hold, as `bd_searched` reads it: each text value, and each text
    in a list; not numbers, true/false, nor what an object holds."""
    texts = []
    for value in fields.values():
        for inner in value if isinstance(value, list) else [value]:
            if isinstance(inner, str):
                texts.append(inner)
    return texts


def searched_in_python(title: str | None, fields: str | None) -> str:
    texts = texts_of(json.loads(fields)) if fields else []
    return plain_upper((title or "") + SEPARATOR + json.dumps(texts, ensure_ascii=False))


def searchable(q: str) -> str:
    """The text searched for, as `bd_searched` writes what it is looked for in."""
    if connection.vendor != "postgresql":
        return plain_upper(q)
    with connection.cursor() as cursor:
        cursor.execute("SELECT upper(bd_unaccent(%s))", [q])
        return cursor.fetchone()[0]


def give_sqlite_the_function(sender, connection, **kwargs) -> None:
    """On `connection_created` (connected in `LedgerConfig.ready`)."""
    if connection.vendor == "sqlite":
        connection.connection.create_function("bd_searched", 2, searched_in_python, deterministic=True)
        connection.connection.create_function("bd_unaccent", 1, plain_upper, deterministic=True)
