"""Lists of items (a job's items, the review list) narrowed by a product field and sorted by a column.

A field filter names a field of the item's source revision (`brand`), how to compare (`is`,
`contains`, `≥`, `≤`) and a value. The field's name reaches the database only as a parameter, through
Django's JSON key transforms. `is` and `contains` compare the value as text, whatever the case (a
number as JSON writes it); `≥` and `≤` compare JSON numbers only (a price written as text, "75.23
EUR", is no number). No index answers it: the database reads each item of the list in turn (a job of
50,000 items: see the README).

A sort names a column of the table (`sku`, `-sku` for descending); the list's own order breaks ties,
so that the keyset pages (`paging.py`) still name one row each. An unknown sort is ignored and said."""

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from django import forms
from django.db.models import F, FloatField, Func, QuerySet
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.http import QueryDict

from ledger.drafts.json_values import text_problem

COMPARISONS = {"is": "is", "contains": "contains", "gte": "≥ (numbers)", "lte": "≤ (numbers)"}


class JsonNumber(Func):
    """A JSON value as a number when it is one, else NULL (text, true/false, a list: never a number)."""

    output_field = FloatField()

    def as_postgresql(self, compiler, connection, **extra):
        value, params = compiler.compile(self.get_source_expressions()[0])  # jsonb
        return f"(CASE WHEN jsonb_typeof({value}) = 'number' THEN ({value})::numeric END)", (*params, *params)

    def as_sqlite(self, compiler, connection, **extra):
        value, params = compiler.compile(self.get_source_expressions()[0])  # JSON_EXTRACT: SQL values
        return f"(CASE WHEN typeof({value}) IN ('integer', 'real') THEN {value} END)", (*params, *params)


class FieldFilterForm(forms.Form):
    """`field`, `compare` and `value` of the URL; all empty: no filter."""

    field = forms.CharField(required=False, max_length=100, label="Product field")
    compare = forms.ChoiceField(required=False, choices=list(COMPARISONS.items()), label="Compared")
    value = forms.CharField(required=False, max_length=300, label="Value", strip=False)

    def clean(self):
        data = super().clean()
        field, value = data.get("field", "").strip(), data.get("value", "")
        compare = data.get("compare") or "is"
        if self.errors or not (field or value.strip()):
            return data
        if not field:
            raise forms.ValidationError("Name the product field to compare (for example brand).")
        if (problem := text_problem(field)) is not None:
            raise forms.ValidationError(f"That field name {problem}.")
        if field.isdigit():
            raise forms.ValidationError("A field named only by digits cannot be compared here.")
        if not value.strip():
            raise forms.ValidationError(f"Write the value {field} is compared with.")
        if compare in ("gte", "lte"):
            try:
                number = Decimal(value.strip())
            except InvalidOperation:
                raise forms.ValidationError(
                    f"≥ and ≤ compare numbers: “{value.strip()}” is not a number."
                ) from None
            if not number.is_finite():
                raise forms.ValidationError(f"“{value.strip()}” is not a number.")
            value = number
        return {"field": field, "compare": compare, "value": value}

    @property
    def active(self) -> bool:
        return self.is_valid() and bool(self.cleaned_data.get("field"))

    def words(self) -> str:
        data = self.cleaned_data
        return f"{data['field']} {COMPARISONS[data['compare']].split(' ')[0]} {data['value']}"


def with_field(
    items: QuerySet, form: FieldFilterForm, *, fields: str = "source_revision__fields"
) -> QuerySet:
    """`items` whose source revision's field matches the (valid, active) filter."""
    field, compare, value = (form.cleaned_data[name] for name in ("field", "compare", "value"))
    if compare in ("gte", "lte"):
        items = items.alias(field_number=JsonNumber(KeyTransform(field, fields)))
        return items.filter(**{f"field_number__{compare}": float(value)})
    items = items.alias(field_text=KeyTextTransform(field, fields))
    return items.filter(**{"field_text__iexact" if compare == "is" else "field_text__icontains": value})


@dataclass(frozen=True)
class Column:
    """A sortable column: its name in the URL, its heading, and what it sorts by (a field of the item,
    or a path through its relations)."""

    name: str
    label: str
    key: str


@dataclass(frozen=True)
class Heading:
    column: Column
    url: str
    # "ascending", "descending" or "" (aria-sort's words): how the list is sorted by this column now.
    sorted: str


@dataclass(frozen=True)
class Sorting:
    """What `sort=` asked for, read: the annotation to add, the page's order, the headings' links, and
    a message for a sort this list does not know."""

    order: list[str]
    annotations: dict
    headings: dict[str, Heading]
    refused: str = ""

    def apply(self, items: QuerySet) -> QuerySet:
        return items.annotate(**self.annotations) if self.annotations else items


SORT_KEY = "sort_key"


def sorting(query: QueryDict, columns: list[Column], *, default: list[str], tie: str = "id") -> Sorting:
    """The order `sort=` names (a column, `-` first for descending), ending with `tie` so each row has
    one place; `default` when it names none. An unknown one is refused in words and ignored."""
    asked = query.get("sort", "").strip()
    by_name = {column.name: column for column in columns}
    chosen, descending, refused = None, asked.startswith("-"), ""
    if asked:
        chosen = by_name.get(asked.removeprefix("-"))
        if chosen is None:
            refused = f"This list cannot be sorted by “{asked[:100]}”: it is in its usual order."
    if chosen is None:
        order, annotations = list(default), {}
    else:
        sign = "-" if descending else ""
        order, annotations = [f"{sign}{SORT_KEY}", f"{sign}{tie}"], {SORT_KEY: F(chosen.key)}
    headings = {}
    for column in columns:
        now = "" if column is not chosen else ("descending" if descending else "ascending")
        # A click on the column sorts by it ascending; on the column sorted ascending, descending.
        wanted = f"-{column.name}" if now == "ascending" else column.name
        params = query.copy()
        params.pop("page", None)
        params["sort"] = wanted
        headings[column.name] = Heading(column, "?" + params.urlencode(), now)
    return Sorting(order, annotations, headings, refused)
