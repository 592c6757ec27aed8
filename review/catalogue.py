"""The catalogue: products with their revision history, what was drafted and published, and imports."""

from collections import defaultdict
from dataclasses import dataclass
from functools import partial

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import filesizeformat
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from ledger.catalogue import SKU_PATTERN, confirm_import, discard_import, report_of, store_upload
from ledger.models import (
    CatalogueImport,
    GeneratedVersion,
    ImportState,
    Item,
    Product,
    SourceRevision,
    canonical_json,
)

from .common import HtmxHttpRequest, ShownValue, fields_of, shown_value, wants_partial
from .jobs import polled
from .paging import capped_count, capped_screen_page, screen_page
from .permissions import APPROVERS, VIEWERS, has_role, role_required
from .screen_forms import CatalogueImportForm, ProductFilterForm
from .search import FOUND_CAP, found_products, search

PRODUCTS_PER_PAGE = 50


@require_GET
@login_required
@role_required(*VIEWERS)
def catalogue(request: HtmxHttpRequest) -> HttpResponse:
    products = Product.objects.select_related("current_revision")
    filters = ProductFilterForm(request.GET)
    counted, search_capped, found = True, False, None
    if filters.is_valid():
        if q := filters.cleaned_data["q"].strip():
            how = search(q, cap=FOUND_CAP)
            if how.walk is not None:
                # Text common all over the catalogue: read in SKU order, a page found after a few
                # hundred rows; counting would check every row.
                products, counted = products.filter(how.walk), False
            else:
                # The index search once, for the page and its count; of more than FOUND_CAP
                # matches, the first FOUND_CAP found.
                products, search_capped = found_products(products, how), how.capped
                if not search_capped:
                    found = len(how.ids)
        if status := filters.cleaned_data["status"]:
            products, found = products.filter(status=status), None
    if search_capped:
        count = (FOUND_CAP, True)
    elif found is not None:
        count = found  # every product found is on the list
    else:
        count = partial(capped_count, products) if counted else None
    context = {
        "filters": filters,
        "page": screen_page(
            products,
            order=["sku"],
            per_page=PRODUCTS_PER_PAGE,
            page=request.GET.get("page"),
            count=count,
        ),
        "search_capped": search_capped,
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
    if not SKU_PATTERN.fullmatch(sku):  # no product has such a SKU; PostgreSQL cannot even look for a NUL
        raise Http404
    product = get_object_or_404(
        Product.objects.select_related("current_revision", "published_version__item__job"), sku=sku
    )
    context = {
        "product": product,
        "current_fields": fields_of(product.current_revision),
        "history": revision_history(product),
        "drafts": drafts_of(product),
        "can_edit": has_role(request.user, *APPROVERS),
    }
    return render(request, "catalogue_product.html", context)


# --- importing -----------------------------------------------------------------------------


class UploadSizeCap(FileUploadHandler):
    """Stops keeping an upload once it passes BATCHDESK_IMPORT_MAX_BYTES. The rest of the request is
    read and dropped (not cut off), so the browser gets the page that says why."""

    def __init__(self, request: HttpRequest, limit: int) -> None:
        super().__init__(request)
        self.limit = limit
        self.received = 0
        self.too_large = False

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        self.received += len(raw_data)
        if self.received > self.limit:
            self.too_large = True
            raise StopUpload(connection_reset=False)
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None


def too_large_message(limit: int) -> str:
    return (
        f"The file is larger than {filesizeformat(limit)}, the most the import screen takes. Split it, "
        "or import it with manage.py import_catalogue, which reads files of any size."
    )


@csrf_exempt  # checked below, once the upload handlers are in place
@require_http_methods(["GET", "POST"])
@login_required
@role_required(*VIEWERS)
def catalogue_import(request: HtmxHttpRequest) -> HttpResponse:
    """Upload a JSONL or CSV file: the same all-or-nothing import, summary and line-numbered report
    as `manage.py import_catalogue`. Every file is imported by a worker (one import writes at a
    time: a small file may wait for a big one, and never inside a web request) while the upload's
    page shows how far it has come."""
    can_import = has_role(request.user, *APPROVERS)
    if request.method == "GET":
        return render(
            request, "catalogue_import.html", {"form": ImportUploadForm(), "can_import": can_import}
        )
    if not can_import:
        raise PermissionDenied
    # Before anything reads the body: CSRF's check reads the form, and with it the whole file.
    cap = UploadSizeCap(request, settings.BATCHDESK_IMPORT_MAX_BYTES)
    request.upload_handlers.insert(0, cap)
    return receive_upload(request, cap)


@csrf_protect
def receive_upload(request: HtmxHttpRequest, cap: UploadSizeCap) -> HttpResponse:
    form = ImportUploadForm(request.POST, request.FILES)
    if not form.is_valid() and cap.too_large:  # the file was dropped: say why, not "required"
        form.errors["file"] = form.error_class([too_large_message(cap.limit)])
        return render(request, "catalogue_import.html", {"form": form, "can_import": True}, status=413)
    if not form.is_valid():
        return render(request, "catalogue_import.html", {"form": form, "can_import": True}, status=400)
    stored = store_upload(
        form.cleaned_data["file"],
        uploaded_by=request.user,
        skip_invalid=form.cleaned_data["skip_invalid"],
        replace=form.cleaned_data["replace"],
        preview_first=request.POST.get("step") == "preview",
    )
    # To the upload's own page: reloading it follows the import, never uploads the file again.
    return redirect("import_detail", stored.pk)


class ImportUploadForm(CatalogueImportForm):
    replace = forms.BooleanField(
        required=False,
        label="Replace whole records",
        help_text="Each record becomes its product's whole content: fields it does not name are removed. "
        "Otherwise a file changes only the columns or keys it names.",
    )


def import_context(stored: CatalogueImport) -> dict:
    reported = stored.state in (ImportState.DONE, ImportState.PREVIEWED, ImportState.DISCARDED)
    return {
        "stored": stored,
        "report": report_of(stored) if reported else None,
        "polling": stored.at_work,
    }


@require_GET
@login_required
@role_required(*VIEWERS)
def catalogue_import_detail(request: HtmxHttpRequest, import_id: int) -> HttpResponse:
    """One upload: its progress while a worker imports it (polled every 2 s), then its report."""
    stored = get_object_or_404(CatalogueImport.objects.select_related("uploaded_by"), pk=import_id)
    context = {**import_context(stored), "can_import": has_role(request.user, *APPROVERS)}
    if wants_partial(request):
        return polled(render(request, "catalogue_import.html#outcome", context), context["polling"])
    context["form"] = ImportUploadForm()
    return render(request, "catalogue_import.html", context)


@require_POST
@login_required
@role_required(*APPROVERS)
def import_confirm(request: HtmxHttpRequest, import_id: int) -> HttpResponse:
    """The person saw the preview (counts, changed fields, the work queued again and its cost) and
    imports the file: a worker imports it, and this page follows it (rule 16)."""
    stored = get_object_or_404(CatalogueImport, pk=import_id)
    seen = ConfirmImportForm(request.POST)
    requeues_seen = seen.cleaned_data["requeues"] if seen.is_valid() else None
    if not confirm_import(stored.pk, confirmed_by=request.user, requeues_seen=requeues_seen):
        stored.refresh_from_db()
        if stored.state == ImportState.PREVIEWED:
            messages.warning(
                request,
                "Nothing was imported: the preview changed since your page showed it. "
                "Look at it as it is now and confirm again.",
            )
        else:
            messages.info(request, "This import is no longer waiting for confirmation.")
    return redirect("import_detail", stored.pk)


class ConfirmImportForm(forms.Form):
    """The preview the person confirms, as their page showed it: how many items it would queue again."""

    requeues = forms.IntegerField(min_value=0)


@require_POST
@login_required
@role_required(*APPROVERS)
def import_discard(request: HtmxHttpRequest, import_id: int) -> HttpResponse:
    """The person does not import a previewed file: nothing changes, the file is let go."""
    stored = get_object_or_404(CatalogueImport, pk=import_id)
    if not discard_import(stored.pk):
        messages.info(request, "This import is no longer waiting for confirmation.")
    return redirect("import_detail", stored.pk)


IMPORTS_PER_PAGE = 25


@require_GET
@login_required
@role_required(*VIEWERS)
def import_history(request: HtmxHttpRequest) -> HttpResponse:
    """Past imports from the screen, newest first."""
    imports = CatalogueImport.objects.select_related("uploaded_by", "confirmed_by")
    page = capped_screen_page(
        imports, page=request.GET.get("page"), order=["-created_at", "-id"], per_page=IMPORTS_PER_PAGE
    )
    rows = [(stored, report_of(stored) if stored.counts else None) for stored in page]
    return render(request, "catalogue_imports.html", {"page": page, "rows": rows})
