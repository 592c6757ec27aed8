"""Ids that people send: in addresses, query strings and forms. One strict reading for all of them.

An id is written with the ASCII digits 0-9, without sign, padding or leading zeros, and fits a
PostgreSQL bigint (1 to 2**63-1). Python's int() is more generous: it reads '١٢' (Arabic-Indic
digits) and ' 12 ', while '²'.isdigit() is True and int('²') fails; a 30-digit number passes both
and only the database refuses it. Anything else is refused here, before a query is made.
"""

import re

from django import forms
from django.urls import register_converter
from django.urls.converters import get_converters

MAX_ID = 2**63 - 1
ID_TEXT = re.compile(r"[1-9][0-9]{0,18}")
INVALID_ID = "Ids are whole numbers from 1, written with the digits 0 to 9."


def parse_id(value: object) -> int | None:
    """The id `value` names, or None when it is not an id (any type other than text included)."""
    if not isinstance(value, str) or not ID_TEXT.fullmatch(value):
        return None
    number = int(value)
    return number if number <= MAX_ID else None


class IdConverter:
    """`<id:name>` in a URL pattern: an address with anything but an id there matches nothing (404)."""

    regex = "[0-9]+"

    def to_python(self, value: str) -> int:
        number = parse_id(value)
        if number is None:
            raise ValueError(INVALID_ID)
        return number

    def to_url(self, value: int) -> str:
        return str(value)


def register_id_converter() -> None:
    """Makes `<id:name>` usable in URL patterns. Each URL module calls it; the first one registers it."""
    if "id" not in get_converters():
        register_converter(IdConverter, "id")


class IdField(forms.Field):
    """One id in a form; empty is None (or "required")."""

    widget = forms.NumberInput
    default_error_messages = {"invalid": INVALID_ID}

    def to_python(self, value) -> int | None:
        if value in self.empty_values:
            return None
        number = parse_id(value)
        if number is None:
            raise forms.ValidationError(self.error_messages["invalid"], code="invalid")
        return number
