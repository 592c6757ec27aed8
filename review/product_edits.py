"""One product edited or withdrawn on its page (`/catalogue/{sku}/edit`, `/catalogue/{sku}/withdraw`):
first what it would stop and queue again in unfinished jobs, with the estimated cost (the import
screen's dry run, `estimate_revision`), then a confirm step. The verbs are the API's
(`revise_product`, `withdraw_product`): the same checks, the same revision rule.

How a field is edited: each field keeps its kind (text, number, true/false, JSON), chosen beside its
value and preset from the value it has now, so a number stays a number unless the person picks
another kind. A list or an object is edited as JSON text, checked before anything else. A cleared
value removes the field, as an import's blank cell does."""

import json
from dataclasses import dataclass

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from ledger.actions.products import withdraw_product
from ledger.catalogue import (
    SKU_PATTERN,
    ImportWriting,
    ProductRefused,
    check_product_record,
    estimate_revision,
    revise_product,
)
from ledger.models import Product, SourceRevision, canonical_json

from .catalogue import revision_changes
from .common import HtmxHttpRequest, refused_page
from .permissions import APPROVERS, role_required

KINDS = {"text": "text", "number": "number", "boolean": "true / false", "json": "JSON"}


@dataclass
class EditedField:
    """One row of the edit form: a field's name, its kind and its value as the person wrote it."""

    name: str
    kind: str
    value: str
    problem: str = ""

    @property
    def multiline(self) -> bool:
        return self.kind == "json" or "\n" in self.value


def kind_of(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "text"
    return "json"


def written(value: object) -> str:
    """A stored value as the form shows it: text as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=2 if isinstance(value, list | dict) else None)


def value_of(row: EditedField) -> object:
    """The JSON value a row means; None for a cleared value (the field is removed). ValueError says
    why a value does not fit its kind."""
    text = row.value.strip()
    if not text:
        return None
    if row.kind == "text":
        return row.value
    if row.kind == "boolean":
        if text.lower() not in ("true", "false"):
            raise ValueError("write true or false")
        return text.lower() == "true"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        if row.kind == "number":
            raise ValueError("not a number") from None
        raise ValueError(f"not JSON ({exc.msg}, at character {exc.pos + 1})") from None
    if row.kind == "number" and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ValueError("not a number")
    return value


def rows_of(fields: dict) -> list[EditedField]:
    return [EditedField(name, kind_of(value), written(value)) for name, value in fields.items()]


def posted_rows(data, product: Product) -> tuple[str, list[EditedField], EditedField]:
    """The title, the product's field rows and the new field's row, as posted. Existing fields are
    named by their position in the current revision: a posted name is never a field's name."""
    names = list(product.current_revision.fields)
    rows = []
    for position, name in enumerate(names):
        kind = data.get(f"field-{position}-kind", "")
        rows.append(
            EditedField(name, kind if kind in KINDS else "text", data.get(f"field-{position}-value", ""))
        )
    kind = data.get("new-kind", "")
    new = EditedField(
        data.get("new-name", "").strip(), kind if kind in KINDS else "text", data.get("new-value", "")
    )
    return data.get("title", ""), rows, new


def content_of(rows: list[EditedField], new: EditedField) -> tuple[dict, bool]:
    """The fields the rows make ({name: value}), and whether every row could be read (a problem is
    written on its row)."""
    fields, readable = {}, True
    for row in [*rows, new] if new.name or new.value.strip() else rows:
        if row is new and not row.name:
            row.problem, readable = "name the new field", False
            continue
        if row is new and row.name in fields:
            row.problem, readable = "a field of that name is above: change it there", False
            continue
        try:
            value = value_of(row)
        except ValueError as exc:
            row.problem, readable = str(exc), False
            continue
        if value is not None:
            fields[row.name] = value
    return fields, readable


def edit_page(request, product, *, title, rows, new, problems=None, status=200) -> HttpResponse:
    context = {
        "product": product,
        "title": title,
        "rows": rows,
        "new": new,
        "kinds": KINDS,
        "problems": problems or {},
    }
    return render(request, "catalogue_product_edit.html", context, status=status)


def product_of(sku: str) -> Product:
    if not SKU_PATTERN.fullmatch(sku):
        raise Http404
    return get_object_or_404(Product.objects.select_related("current_revision"), sku=sku)


def preview_page(request, product: Product, title: str, fields: dict, *, status: int = 200) -> HttpResponse:
    """What saving would change and stop, and the confirm step; an import at work: the form again."""
    try:
        report = estimate_revision(sku=product.sku, title=title, fields=fields)
    except ImportWriting as exc:
        messages.warning(request, f"No estimate yet: {exc}.")
        rows, new = rows_of(fields), EditedField("", "text", "")
        return edit_page(request, product, title=title, rows=rows, new=new, status=409)
    proposed = SourceRevision(title=title, fields=fields)
    context = {
        "product": product,
        "changes": revision_changes(product.current_revision, proposed),
        "title": title,
        "report": report,
        "content": canonical_json({"title": title, "fields": fields}),
    }
    return render(request, "catalogue_product_preview.html", context, status=status)


@require_http_methods(["GET", "POST"])
@login_required
@role_required(*APPROVERS)
def edit_product(request: HtmxHttpRequest, sku: str) -> HttpResponse:
    """The form (GET), and what it would do (POST): nothing is saved before the confirm step."""
    product = product_of(sku)
    current = product.current_revision
    if request.method == "GET":
        return edit_page(
            request,
            product,
            title=current.title,
            rows=rows_of(current.fields),
            new=EditedField("", "text", ""),
        )
    if request.POST.get("revision") != str(current.number):
        # The form's rows are the fields of the revision it was made from.
        messages.warning(
            request,
            f"The product changed since the form was opened (revision {current.number} now): nothing was "
            "kept. Here it is as it is now.",
        )
        return edit_page(
            request,
            product,
            title=current.title,
            rows=rows_of(current.fields),
            new=EditedField("", "text", ""),
            status=409,
        )
    title, rows, new = posted_rows(request.POST, product)
    fields, readable = content_of(rows, new)
    checked = check_product_record({**fields, "sku": product.sku, "title": title})
    if not readable or checked.problems:
        return edit_page(
            request, product, title=title, rows=rows, new=new, problems=checked.problems, status=400
        )
    if SourceRevision.hash_content(checked.title, checked.fields) == current.content_hash:
        messages.info(
            request, "Nothing changed: the content is the current revision's. No revision was made."
        )
        return edit_page(request, product, title=title, rows=rows, new=new)
    return preview_page(request, product, checked.title, checked.fields)


@require_POST
@login_required
@role_required(*APPROVERS)
def confirm_edit(request: HtmxHttpRequest, sku: str) -> HttpResponse:
    """Save the content the preview showed, as a new revision, if the product is still the revision
    the preview was made from and the preview would still queue as much again. Sent twice, the
    second finds its content already saved and does nothing (rule 15)."""
    product = product_of(sku)
    back = reverse("catalogue_product", args=[product.sku])
    try:
        content = json.loads(request.POST.get("content", ""))
        title, fields = content["title"], content["fields"]
        revision, requeues = int(request.POST["revision"]), int(request.POST["requeues"])
        if not isinstance(title, str) or not isinstance(fields, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        return refused_page(
            request, "The confirmation is not one this page sent: edit the product again.", back
        )
    current = product.current_revision
    if SourceRevision.hash_content(title, fields) == current.content_hash:
        messages.info(
            request, f"Already saved: revision {current.number} has this content. Nothing else was done."
        )
        return redirect("catalogue_product", product.sku)
    if current.number != revision:
        messages.warning(
            request,
            f"Nothing was saved: the product changed since the preview (revision {current.number} now). "
            "Edit it as it is now.",
        )
        return redirect("edit_product", product.sku)
    try:
        report = estimate_revision(sku=product.sku, title=title, fields=fields)
    except ImportWriting as exc:
        messages.warning(request, f"Nothing was saved: {exc}.")
        return preview_page(request, product, title, fields, status=409)
    if report.items_requeued != requeues:
        messages.warning(
            request,
            "Nothing was saved: what it would queue again changed since the preview. Look at it as it is now "
            "and confirm again.",
        )
        return preview_page(request, product, title, fields, status=409)
    try:
        change = revise_product(sku=product.sku, title=title, fields=fields, actor=request.user)
    except ProductRefused as exc:
        return refused_page(request, f"The content breaks the catalogue's rules: {exc}", back)
    product.refresh_from_db()
    if change.revised:
        queued = f"; {requeues} product{'s' if requeues != 1 else ''} queued again" if requeues else ""
        messages.success(request, f"Saved as revision {product.current_revision.number}{queued}.")
    else:
        messages.info(request, "Already saved: nothing else was done.")
    return redirect("catalogue_product", product.sku)


@require_http_methods(["GET", "POST"])
@login_required
@role_required(*APPROVERS)
def withdraw(request: HtmxHttpRequest, sku: str) -> HttpResponse:
    """What withdrawing would stop (GET), and withdrawing (POST, once: a withdrawn product stays so)."""
    product = product_of(sku)
    if request.method == "POST":
        if not product.is_active:
            messages.info(request, "Already withdrawn: nothing else was done.")
        else:
            withdraw_product(sku=product.sku, actor=request.user)
            messages.success(request, "Withdrawn: nothing will be published for it from now on.")
        return redirect("catalogue_product", product.sku)
    current = product.current_revision
    report = None
    if product.is_active:
        try:
            report = estimate_revision(
                sku=product.sku, title=current.title, fields=current.fields, withdraw=True
            )
        except ImportWriting as exc:
            messages.warning(request, f"No estimate of what it stops yet: {exc}.")
    return render(request, "catalogue_product_withdraw.html", {"product": product, "report": report})
