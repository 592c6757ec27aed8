"""A JSON column that keeps its value as written, keys in their order (SPEC rule 19).

PostgreSQL's `jsonb`, the column Django's JSONField makes there, stores an object with its keys
sorted (shorter names first): an output schema written `headline, description, tone` comes back
`tone, headline, description`, and a model writes the properties in the order it is sent them. Its
`json` type keeps the text as it was given; so does SQLite's text column, which JSONField already
uses there. Nothing queries inside such a column, which is all `jsonb` would be better at.
"""

import json

from django.db import models
from psycopg.types.json import Json


class JSONAsWrittenField(models.JSONField):
    """A JSONField whose PostgreSQL column is `json`: an object's keys come back in their order."""

    def db_type(self, connection) -> str:
        return "json" if connection.vendor == "postgresql" else super().db_type(connection)

    def get_db_prep_value(self, value, connection, prepared=False):
        if connection.vendor != "postgresql":
            return super().get_db_prep_value(value, connection, prepared)
        if not prepared:
            value = self.get_prep_value(value)
        # Sent as `json` (psycopg's Json): Django's own adapter sends `jsonb`, which would sort the
        # keys before the column ever saw them.
        return Json(value, dumps=lambda obj: json.dumps(obj, cls=self.encoder, ensure_ascii=False))

    def from_db_value(self, value, expression, connection):
        # psycopg reads a `json` column itself (Django has it hand over only `jsonb` as text), into a
        # dict whose keys keep their order.
        if connection.vendor == "postgresql":
            return value
        return super().from_db_value(value, expression, connection)
