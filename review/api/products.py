"""Products (SPEC §6, §7): read one, `PUT` its content (checked as the catalogue importer checks a
record), withdraw it."""

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from ledger.actions.products import revise_product, withdraw_product
from ledger.catalogue import (
    MAX_RECORD_BYTES,
    SKU_PATTERN,
    check_fields,
    check_sku,
    check_title,
    normalise_keys,
)
from ledger.models import Product, ProductStatus

from ..permissions import APPROVERS, VIEWERS
from .doors import BEARER_TOKEN, door
from .errors import ApiError, invalid, not_found
from .inputs import read_json
from .shapes import product_json, products


@door(BEARER_TOKEN, GET=VIEWERS, PUT=APPROVERS)
def product_detail(request: HttpRequest, sku: str) -> HttpResponse:
    if request.method == "PUT":
        return put_product(request, sku)
    found = products().filter(sku=sku).first() if SKU_PATTERN.fullmatch(sku) else None
    if found is None:
        return not_found(request, "No product")
    return JsonResponse(product_json(found))


def importer_check(check: Callable[[Any, list[str]], Any], value: Any) -> tuple[Any, str]:
    """One of the catalogue importer's checks: what it returns, and its complaints ("" if none)."""
    complaints: list[str] = []
    result = check(value, complaints)
    return result, "; ".join(complaints)


def product_content(sku: str, data: dict, existing: Product | None) -> tuple[str, dict]:
    """`{title, ...fields}` checked as the importer checks a catalogue record (SPEC §7). `sku`
    and `status` are not content: they may be sent, as long as they say what is already so."""
    problems: dict[str, str] = {}
    _, problems["sku"] = importer_check(check_sku, sku)
    values, problems["body"] = importer_check(normalise_keys, data)
    if values.pop("sku", sku) != sku:
        problems["sku"] = "differs from the SKU in the address"
    if values.pop("status", None) not in (None, existing.status if existing else ProductStatus.ACTIVE):
        problems["status"] = "not content: withdraw a product with POST /api/products/{sku}/withdraw"
    title, problems["title"] = importer_check(check_title, values.pop("title", None))
    fields = {}
    for name, value in values.items():
        checked, problems[name] = importer_check(check_fields, {name: value})
        fields.update(checked)
    problems = {name: problem for name, problem in problems.items() if problem}
    if problems:
        raise invalid(problems)
    return title, fields


def put_product(request: HttpRequest, sku: str) -> HttpResponse:
    data = read_json(request)
    if len(request.body) > MAX_RECORD_BYTES:
        raise ApiError(400, "too_large", f"A product record is at most {MAX_RECORD_BYTES} bytes")
    existing = Product.objects.filter(sku=sku).first() if SKU_PATTERN.fullmatch(sku) else None
    title, fields = product_content(sku, data, existing)
    change = revise_product(sku=sku, title=title, fields=fields, actor=request.user)
    return JsonResponse(product_json(products().get(sku=sku)), status=201 if change.created else 200)


@door(BEARER_TOKEN, POST=APPROVERS)
def withdraw(request: HttpRequest, sku: str) -> HttpResponse:
    read_json(request, allowed=())
    if not SKU_PATTERN.fullmatch(sku) or not Product.objects.filter(sku=sku).exists():
        return not_found(request, "No product")
    withdraw_product(sku=sku, actor=request.user)
    return JsonResponse(product_json(products().get(sku=sku)))
