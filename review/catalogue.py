"""The catalogue: products with their revision history, what was drafted and published, and imports."""

from collections import defaultdict
from dataclasses import dataclass

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Q
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET, require_http_methods

from ledger.catalogue import import_catalogue
from ledger.models import GeneratedVersion, Item, Product, SourceRevision, canonical_json

from .common import HtmxHttpRequest, ShownValue, fields_of, shown_value
from .permissions import APPROVERS, VIEWERS, has_role, role_required
from .screen_forms import CatalogueImportForm, ProductFilterForm

PRODUCTS_PER_PAGE = 50


@require_GET
@login_required
@role_required(*VIEWERS)
def catalogue(request: HtmxHttpRequest) -> HttpResponse:
    products = Product.objects.select_related("current_revision").order_by("sku")
    filters = ProductFilterForm(request.GET)
    if filters.is_valid():
        if q := filters.cleaned_data["q"].strip():
            products = products.filter(Q(sku__icontains=q) | Q(current_revision__title__icontains=q))
        if status := filters.cleaned_data["status"]:
            products = products.filter(status=status)
    context = {
        "filters": filters,
        "page": Paginator(products, PRODUCTS_PER_PAGE).get_page(request.GET.get("page")),
        "can_import": has_role(request.user, *APPROVERS),
    }
    return render(request, "catalogue_list.html", context)


# --- one product ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldChange:
    name: str
    change: str  # added, removed or changed
    old: ShownValue | None = None
    new: ShownValue | None = None


@dataclass(frozen=True)
class RevisionChanges:
    """A revision and what changed from the one before it (for the first: every field, added)."""

    revision: SourceRevision
    previous: SourceRevision | None
    fields: list[FieldChange]

    @property
    def title_changed(self) -> bool:
        return self.previous is not None and self.previous.title != self.revision.title


def revision_changes(previous: SourceRevision | None, revision: SourceRevision) -> RevisionChanges:
    """Fields compare as JSON values: key order inside an object is no change, 1 and true differ."""
    before = previous.fields if previous is not None else {}
    after = revision.fields
    changes = []
    for name in sorted(before.keys() | after.keys()):
        if name not in before:
            changes.append(FieldChange(name, "added", new=shown_value(after[name])))
        elif name not in after:
            changes.append(FieldChange(name, "removed", old=shown_value(before[name])))
        elif canonical_json(before[name]) != canonical_json(after[name]):
            old, new = shown_value(before[name]), shown_value(after[name])
            changes.append(FieldChange(name, "changed", old=old, new=new))
    return RevisionChanges(revision, previous, changes)


def revision_history(product: Product) -> list[RevisionChanges]:
    """Newest first, each compared with the revision before it."""
    revisions = list(product.revisions.order_by("number"))
    previous = [None, *revisions[:-1]]
    return [revision_changes(*pair) for pair in zip(previous, revisions, strict=True)][::-1]


@dataclass(frozen=True)
class Draft:
    """One item of the product (a job's work on one revision) and the versions generated for it."""

    item: Item
    versions: list[GeneratedVersion]


def drafts_of(product: Product) -> list[Draft]:
    """Every item ever made for the product, newest first: two queries, whatever their number."""
    items = list(product.items.select_related("job", "source_revision").order_by("-id"))
    versions = defaultdict(list)
    for version in GeneratedVersion.objects.filter(item__product=product).order_by("item_id", "number"):
        versions[version.item_id].append(version)
    return [Draft(item, versions[item.pk]) for item in items]


@require_GET
@login_required
@role_required(*VIEWERS)
def catalogue_product(request: HtmxHttpRequest, sku: str) -> HttpResponse:
    product = get_object_or_404(
        Product.objects.select_related("current_revision", "published_version__item__job"), sku=sku
    )
    context = {
        "product": product,
        "current_fields": fields_of(product.current_revision),
        "history": revision_history(product),
        "drafts": drafts_of(product),
    }
    return render(request, "catalogue_product.html", context)


# --- importing -----------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@login_required
@role_required(*VIEWERS)
def catalogue_import(request: HtmxHttpRequest) -> HttpResponse:
    """Upload a JSONL or CSV file: the same all-or-nothing import, summary and line-numbered report
    as `manage.py import_catalogue`."""
    can_import = has_role(request.user, *APPROVERS)
    if request.method == "GET":
        return render(
            request, "catalogue_import.html", {"form": CatalogueImportForm(), "can_import": can_import}
        )
    if not can_import:
        raise PermissionDenied
    form = CatalogueImportForm(request.POST, request.FILES)
    if not form.is_valid():
        return render(request, "catalogue_import.html", {"form": form, "can_import": True}, status=400)
    upload = form.cleaned_data["file"]
    report = import_catalogue(upload, skip_invalid=form.cleaned_data["skip_invalid"])
    context = {
        "form": CatalogueImportForm(initial={"skip_invalid": form.cleaned_data["skip_invalid"]}),
        "can_import": True,
        "report": report,
        "file_name": upload.name,
    }
    return render(request, "catalogue_import.html", context, status=200 if report.imported else 400)
