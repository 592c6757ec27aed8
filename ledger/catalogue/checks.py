"""The rules of one catalogue record (SPEC §7): its SKU, title, status and fields. The API checks a
product's body with the same rules.
"""

import json
from dataclasses import dataclass

from ..drafts.json_values import (
    MAX_FIELD_DEPTH,
    FieldValue,
    json_value_problem,
    shown,
    text_problem,
)
from ..models import ProductStatus
from .digests import SeenSkus
from .records import MAX_TITLE_LENGTH, SKU_PATTERN, SKU_RULE, Record, Rejection

# The keys of a JSONL record that are not product fields.
NOT_FIELDS = frozenset(("sku", "title", "status"))


STATUSES = frozenset(ProductStatus.values)


@dataclass(frozen=True)
class CheckedProduct:
    """One product record read against SPEC §7's rules. `problems` says what is wrong where: "body"
    (its keys), "sku", "title", "status", then each field by its name, in that order."""

    sku: str | None
    title: str | None
    status: str | None
    fields: dict[str, FieldValue]
    cleared: tuple[str, ...]
    problems: dict[str, list[str]]

    def words(self) -> str:
        return "; ".join(problem for found in self.problems.values() for problem in found)


def check_product_record(
    data: dict[str, object], *, seen: "SeenSkus | None" = None, line: int = 0
) -> CheckedProduct:
    """The one check of a product's record (its sku, title, status and fields), for the importer,
    the API and `revise_product` alike. The importer passes the SKUs `seen` on earlier lines."""
    problems: dict[str, list[str]] = {"body": [], "sku": [], "title": [], "status": []}
    values = normalise_keys(data, problems["body"])
    sku = check_sku(values.pop("sku", None), problems["sku"])
    if sku is not None and seen is not None and (first := seen.first_line(sku, line)) is not None:
        problems["sku"].append(f'sku "{sku}" appears again (first on line {first})')
    title = check_title(values.pop("title", None), problems["title"])
    status = check_status(values.pop("status", None), problems["status"])
    field_problems: list[str] = []
    fields = check_fields(values, field_problems)
    if field_problems:  # rare: each field again, so that each problem is told by the field's name
        for name, value in values.items():
            check_fields({name: value}, problems.setdefault(name, []))
    problems = {where: found for where, found in problems.items() if found}
    # Fields named with a blank value (an empty cell, "", null): an existing product loses them.
    cleared = tuple(name for name in values if name not in fields)
    return CheckedProduct(sku, title, status, fields, cleared, problems)


def check_record(line: int, data: dict[str, object], seen: "SeenSkus") -> Record | Rejection:
    checked = check_product_record(data, seen=seen, line=line)
    if checked.problems or checked.sku is None or checked.title is None:
        return Rejection(line, checked.words())
    return Record(line, checked.sku, checked.title, checked.status, checked.fields, checked.cleared)


def normalise_keys(data: dict[str, object], problems: list[str]) -> dict[str, object]:
    values: dict[str, object] = {}
    for key, value in data.items():
        name = key.strip()
        if not name:
            problems.append("a field has no name")
        elif name in values:
            problems.append(f'the field "{name}" appears twice')
        elif (problem := text_problem(name)) is not None:
            problems.append(f"a field name {problem}")
        else:
            values[name] = value
    return values


def check_sku(value: object, problems: list[str]) -> str | None:
    if value is not None and not isinstance(value, str):
        problems.append("sku must be text")
        return None
    sku = (value or "").strip()
    if not sku:
        problems.append("sku is missing")
        return None
    if not SKU_PATTERN.fullmatch(sku):
        problems.append(f"sku {shown(sku)} is not valid ({SKU_RULE})")
        return None
    return sku


def check_title(value: object, problems: list[str]) -> str | None:
    if value is None:
        problems.append("title is missing")
        return None
    if not isinstance(value, str):
        problems.append("title must be text")
        return None
    title = value.strip()
    if not title:
        problems.append("title is empty")
        return None
    if len(title) > MAX_TITLE_LENGTH:
        problems.append(f"title is {len(title)} characters long; at most {MAX_TITLE_LENGTH}")
        return None
    if (problem := text_problem(title)) is not None:
        problems.append(f"title {problem}")
        return None
    return title


def check_status(value: object, problems: list[str]) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        problems.append("status must be text: active or withdrawn")
        return None
    status = value.strip().lower()
    if not status:
        return None
    if status not in ProductStatus.values:
        problems.append(f"status {shown(value.strip())} is not valid (active or withdrawn)")
        return None
    return status


def check_fields(values: dict[str, object], problems: list[str]) -> dict[str, FieldValue]:
    """Every other key is a product field, as read from JSON or CSV. Blank values (empty cells, "",
    null) are left out and text is stripped; inside a list or an object every value is kept as given."""
    fields: dict[str, FieldValue] = {}
    # One quick look at the whole record usually clears every field (stripping changes nothing it sees).
    plain = _plainly_storable(values)
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, str):
            value = value.strip()
            if not value:
                continue
        if not plain and (problem := json_value_problem(value, f'field "{name}"')):
            problems.append(problem)
        else:
            fields[name] = value
    return fields


def _plainly_storable(values: dict[str, object]) -> bool:
    """A quick yes, in C rather than a walk in Python, for most records read from JSON or CSV (which
    hold JSON types only); no means `json_value_problem` looks at each field closely."""
    try:
        text = json.dumps(values, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return False
    # So few brackets cannot nest too deep. NUL is written as an escape; an unpaired surrogate is
    # left as it is, and cannot be encoded.
    return (
        text.count("[") + text.count("{") <= MAX_FIELD_DEPTH
        and "\\u0000" not in text
        and text_problem(text) is None
    )
