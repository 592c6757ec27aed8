"""Pages of long lists that cost the same on the first page and the millionth: keyset pagination.

A page is asked for with `page=`: a page number for the first pages (1, 2, … while the rows skipped
stay under PAGE_NUMBER_DEPTH: a number means OFFSET, which reads every row it skips), `last`, or
the opaque cursor that a page's "next" and "previous" links carry once past the numbered pages. A cursor names the row a page starts after
(or ends before) by the list's ordering key, so the database starts reading there, from an index;
it is signed, so a changed one is refused like any other bad value. Rows added or decided meanwhile
shift nothing: the next page starts right after the last row shown.

The screens treat a bad `page` as the first page; the API answers 400 (`PageRefused`)."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from django.core import signing
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import connections, router
from django.db.models import BooleanField, Model, Q, QuerySet
from django.db.models.expressions import RawSQL

# How deep page numbers reach (in rows skipped): beyond it, only cursors.
PAGE_NUMBER_DEPTH = 5_000
# Counts that are not kept anywhere are counted up to this and then shown as "more than".
COUNT_CAP = 10_000
SALT = "batchdesk.paging"


class PageRefused(ValueError):
    """`page=` is neither a page number within reach nor a cursor this server gave out."""


@dataclass
class KeysetPage:
    object_list: list
    # How many rows the whole list has: exact, or at least this many when `count_capped`; None
    # when not counted.
    count: int | None
    count_capped: bool = False
    next_page: str | None = None
    previous_page: str | None = None
    # Rows shown before this page, when known (page numbers); None after a cursor.
    offset: int | None = 0
    per_page: int | None = None

    def __iter__(self):
        return iter(self.object_list)

    def __len__(self) -> int:
        return len(self.object_list)

    @property
    def has_next(self) -> bool:
        return self.next_page is not None

    @property
    def has_previous(self) -> bool:
        return self.previous_page is not None

    @property
    def has_other_pages(self) -> bool:
        return self.has_next or self.has_previous

    @property
    def number(self) -> int | None:
        """The page's number, when it was reached by number."""
        return None if self.offset is None or self.per_page is None else self.offset // self.per_page + 1

    @property
    def num_pages(self) -> int | None:
        if self.count is None or self.count_capped or not self.per_page:
            return None
        return max(1, -(-self.count // self.per_page))


def capped_count(rows: QuerySet, cap: int = COUNT_CAP) -> tuple[int, bool]:
    """(count, capped): counts at most `cap` + 1 rows, so a huge list costs what `cap` rows cost."""
    n = rows.order_by()[: cap + 1].count()
    return (cap, True) if n > cap else (n, False)


def _field_names(order: Sequence[str]) -> list[str]:
    return [name.removeprefix("-") for name in order]


def _is_column(model: type[Model], name: str) -> bool:
    """Whether `name` is a column of the model's table; otherwise it names an annotation (a sort by a
    related row's value, say `F("product__sku")`)."""
    if name in ("id", "pk"):
        return True
    try:
        return model._meta.get_field(name).concrete
    except FieldDoesNotExist:
        return False


def key_of(row: Model, order: Sequence[str]) -> list:
    """The row's ordering key as JSON values (times as ISO text)."""
    values = []
    for name in _field_names(order):
        if name in ("id", "pk"):
            value = row.pk
        elif _is_column(type(row), name):
            value = getattr(row, row._meta.get_field(name).attname)
        else:
            value = getattr(row, name)
        values.append(value.isoformat() if hasattr(value, "isoformat") else value)
    return values


def cursor_for(direction: str, key: list) -> str:
    """The signed cursor of the rows `direction` ("after" or "before") the ordering key `key`."""
    return signing.dumps({direction: key}, salt=SALT, compress=True)


def read_cursor(model: type[Model], order: Sequence[str], token: str) -> tuple[str, list]:
    """(direction, ordering key) of a cursor this server gave out; PageRefused for any other text."""
    try:
        data = signing.loads(token, salt=SALT)
    except signing.BadSignature:
        raise PageRefused("not a page number or a cursor from a next or previous link") from None
    if not isinstance(data, dict) or len(data) != 1 or next(iter(data)) not in ("after", "before"):
        raise PageRefused("not a cursor of this list")
    direction, raw = next(iter(data.items()))
    names = _field_names(order)
    if not isinstance(raw, list) or len(raw) != len(names):
        raise PageRefused("not a cursor of this list")
    try:
        key = [
            model._meta.pk.to_python(value)
            if name in ("id", "pk")
            else model._meta.get_field(name).to_python(value)
            if _is_column(model, name)
            else _annotated(value)
            for name, value in zip(names, raw, strict=True)
        ]
    except (ValidationError, TypeError, ValueError):
        raise PageRefused("not a cursor of this list") from None
    if any(value is None for value in key):
        raise PageRefused("not a cursor of this list")
    return direction, key


def _annotated(value):
    """A cursor's value of an annotation: text or a number, as `key_of` wrote it."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise TypeError(value)
    return value


def rows_beyond(model: type[Model], order: Sequence[str], key: list, *, backwards: bool) -> RawSQL | Q:
    """Rows strictly after `key` in `order` (strictly before it, `backwards`), as one row-value
    comparison, `(a, b) > (%s, %s)`: the database reads an index on (a, b) from that point on. Every
    field of `order` runs the same way (all ascending or all descending)."""
    if len({name.startswith("-") for name in order}) != 1:
        raise ValueError("a keyset order runs one way: every field ascending, or every one descending")
    ascending = not order[0].startswith("-")
    if not all(_is_column(model, name) for name in _field_names(order)):
        return _beyond_annotated(order, key, after=ascending != backwards)
    table = model._meta.db_table
    columns = ", ".join(f'"{table}"."{model._meta.get_field(name).column}"' for name in _field_names(order))
    sign = ">" if ascending != backwards else "<"
    marks = ", ".join(["%s"] * len(key))
    connection = connections[router.db_for_read(model)]
    values = [
        model._meta.get_field(name).get_db_prep_value(value, connection)
        for name, value in zip(_field_names(order), key, strict=True)
    ]
    return RawSQL(f"({columns}) {sign} ({marks})", values, output_field=BooleanField())


def _beyond_annotated(order: Sequence[str], key: list, *, after: bool) -> Q:
    """Rows after (or before) `key` where the order names an annotation, which a row-value comparison
    of table columns cannot: `a > x OR (a = x AND b > y)`, as Django filters. Such a list is sorted
    by a value no index of its table keeps, so this costs what sorting it costs anyway."""
    lookup = "gt" if after else "lt"
    names = _field_names(order)
    beyond = Q()
    for position, name in enumerate(names):
        equal = dict(zip(names[:position], key[:position], strict=True))
        beyond |= Q(**equal, **{f"{name}__{lookup}": key[position]})
    return beyond


def reversed_order(order: Sequence[str]) -> list[str]:
    return [name.removeprefix("-") if name.startswith("-") else f"-{name}" for name in order]


def keyset_page(
    rows: QuerySet,
    *,
    order: Sequence[str],
    per_page: int,
    page: str | None,
    count: int | Callable[[], int | tuple[int, bool]] | None = None,
) -> KeysetPage:
    """One page of `rows` in `order` (field names, `-` for descending, ending with a unique one).
    `count` is the list's size when the caller keeps it (tallies), or a function that counts it.
    Raises PageRefused for a bad `page`."""
    order = list(order)
    token = (page or "").strip() or "1"
    offset: int | None = None
    following: str | None = None
    if token.isascii() and token.isdigit():
        number = int(token)
        offset = (number - 1) * per_page
        if number < 1:
            raise PageRefused("page numbers start at 1")
        if offset >= PAGE_NUMBER_DEPTH:
            raise PageRefused(
                f"page numbers reach the first {PAGE_NUMBER_DEPTH:,} rows; further on, follow the next "
                "link, which carries a cursor"
            )
        fetched = list(rows.order_by(*order)[offset : offset + per_page + 1])
        more_after, more_before = len(fetched) > per_page, number > 1
        shown = fetched[:per_page]
        previous = str(number - 1) if more_before else None
        if more_after and offset + per_page < PAGE_NUMBER_DEPTH:
            following = str(number + 1)
    elif token == "last":
        fetched = list(rows.order_by(*reversed_order(order))[: per_page + 1])
        more_after, more_before = False, len(fetched) > per_page
        shown = fetched[:per_page][::-1]
        previous = cursor_for("before", key_of(shown[0], order)) if more_before else None
    else:
        direction, key = read_cursor(rows.model, order, token)
        if direction == "after":
            fetched = list(
                rows.filter(rows_beyond(rows.model, order, key, backwards=False)).order_by(*order)[
                    : per_page + 1
                ]
            )
            more_after, more_before = len(fetched) > per_page, True
            shown = fetched[:per_page]
        else:
            fetched = list(
                rows.filter(rows_beyond(rows.model, order, key, backwards=True)).order_by(
                    *reversed_order(order)
                )[: per_page + 1]
            )
            more_after, more_before = True, len(fetched) > per_page
            shown = fetched[:per_page][::-1]
        previous = cursor_for("before", key_of(shown[0], order)) if more_before and shown else None
    if callable(count):
        count = count()
    capped = False
    if isinstance(count, tuple):
        count, capped = count
    return KeysetPage(
        object_list=shown,
        count=count,
        count_capped=capped,
        next_page=following
        or (cursor_for("after", key_of(shown[-1], order)) if more_after and shown else None),
        previous_page=previous,
        offset=offset,
        per_page=per_page,
    )


def screen_page(rows: QuerySet, *, page: str | None, **kwargs) -> KeysetPage:
    """For a screen: a bad `page` shows the first page, as Django's `Paginator.get_page` does."""
    try:
        return keyset_page(rows, page=page, **kwargs)
    except PageRefused:
        return keyset_page(rows, page="1", **kwargs)


def capped_screen_page(
    rows: QuerySet, *, page: str | None, order: Sequence[str], per_page: int
) -> KeysetPage:
    """A screen's page of a list whose size is kept nowhere: counted up to COUNT_CAP."""
    return screen_page(rows, page=page, order=order, per_page=per_page, count=partial(capped_count, rows))
