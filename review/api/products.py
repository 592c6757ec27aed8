"""Products (SPEC §6, §7): read one, `PUT` its content (checked as the catalogue importer checks a
record), withdraw it."""

from django.http import HttpRequest, HttpResponse, JsonResponse

from ledger.actions.products import withdraw_product
from ledger.catalogue import (
    MAX_RECORD_BYTES,
    SKU_PATTERN,
    SKU_RULE,
    check_product_record,
    normalise_keys,
    revise_product,
)
from ledger.drafts.json_values import shown
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


def product_content(sku: str, data: dict, existing: Product | None) -> tuple[str, dict]:
    """`{title, ...fields}` checked as the importer checks a catalogue record (SPEC §7,
    `check_product_record`). `sku` and `status` are not content: they may be sent, as long as they
    say what is already so."""
    key_problems: list[str] = []
    values = normalise_keys(data, key_problems)
    sent_sku = values.pop("sku", sku)
    sent_status = values.pop("status", None)
    checked = check_product_record({**values, "sku": sku})
    problems = {"sku": checked.problems.get("sku"), "body": key_problems}
    if checked.sku is not None and checked.sku != sku:  # the address names a SKU exactly, spaces and all
        problems["sku"] = [f"sku {shown(sku)} is not valid ({SKU_RULE})"]
    if sent_sku != sku:
        problems["sku"] = ["differs from the SKU in the address"]
    if sent_status not in (None, existing.status if existing else ProductStatus.ACTIVE):
        problems["status"] = ["not content: withdraw a product with POST /api/products/{sku}/withdraw"]
    problems["title"] = checked.problems.get("title")
    problems.update((name, checked.problems.get(name)) for name in values if name != "title")
    problems = {where: "; ".join(found) for where, found in problems.items() if found}
    if problems:
        raise invalid(problems)
    return checked.title, checked.fields


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
