"""What the catalogue search reads of a revision: its title without accents and in upper case
(`Crème` is found by `creme`), as the database function `bd_searched` computes it (migration 0056,
with a trigram index on it). Not the fields' values: indexing their text made a first import of
50,000 products 60 % slower (README, "Database extensions"); the SKU is searched beside it.

On PostgreSQL the function (kept in a column of its own) unaccents with the `unaccent` extension (a
trusted extension since PostgreSQL 13: the database's owner creates it, no superuser needed) and
upper-cases; the text searched for goes through the same two steps in the database (`searchable`),
so both always agree. SQLite, the demo's database, has no such extension: each connection is given
the same function written in Python (accents removed by Unicode decomposition, and the letters
decomposition leaves alone mapped as `unaccent` maps them)."""

import unicodedata

from django.db import connection
from django.db.models import Func, TextField

# Letters without a decomposition that `unaccent` still maps (its rules file), upper case.
_PLAIN = str.maketrans({"ß": "SS", "Æ": "AE", "Œ": "OE", "Ø": "O", "Ł": "L", "Đ": "D", "Þ": "TH", "Ð": "D"})


class Searched(Func):
    """`bd_searched(title)`: a revision's text as the search reads it (on PostgreSQL, the expression
    migration 0056 indexes)."""

    function = "bd_searched"
    output_field = TextField()


def plain_upper(text: str) -> str:
    """`text` upper case, accents removed (SQLite's `bd_searched` and `searchable`)."""
    decomposed = unicodedata.normalize("NFKD", text.upper())
    return "".join(c for c in decomposed if not unicodedata.combining(c)).translate(_PLAIN)


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
        connection.connection.create_function(
            "bd_searched", 1, lambda title: plain_upper(title or ""), deterministic=True
        )
        connection.connection.create_function("bd_unaccent", 1, plain_upper, deterministic=True)
