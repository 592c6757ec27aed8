"""Prompt versions: what each says, how it differs from its task's current version, what each
provider is sent of its output schema, the exact request it makes of a provider for a product, new
versions, and making one current. A version is never edited; changing one makes the next version of
its task, which is not current until someone makes it so."""

import difflib
import json
from dataclasses import dataclass

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from ledger.actions import NotAllowed
from ledger.actions.prompts import create_prompt_version, make_prompt_current
from ledger.drafts.schema_dialects import Dialect, LeftToLedger, sent_schema
from ledger.drafts.validation import render_user_message
from ledger.models import CurrentPromptChoice, Product, PromptVersion
from ledger.providers import (
    anthropic,
    cloudflare,
    gemini,
    openai,
    openai_compatible,
    provider_names,
    schema_dialect,
)
from ledger.providers.base import InferenceRequest

from .common import HtmxHttpRequest, wants_partial
from .ids import parse_id
from .permissions import APPROVERS, VIEWERS, has_role, role_required
from .screen_forms import PromptPreviewForm, PromptVersionForm

# Stands in for `bd-<item>-<attempt>`, the custom_id a real request carries.
PREVIEW_CUSTOM_ID = "bd-<item>-<attempt>"


def pretty_json(value: object) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


@require_GET
@login_required
@role_required(*VIEWERS)
def prompts(request: HtmxHttpRequest) -> HttpResponse:
    versions = (
        PromptVersion.objects.with_current().annotate(jobs_using=Count("jobs")).order_by("task", "-version")
    )
    context = {"versions": versions, "can_create": has_role(request.user, *APPROVERS)}
    return render(request, "prompt_list.html", context)


DIALECT_LABELS = {
    Dialect.OPENAI_STRICT: "OpenAI's strict Structured Outputs",
    Dialect.GEMINI: "Gemini's responseJsonSchema subset",
    Dialect.AS_IS: "The schema as it is",
}


@dataclass(frozen=True)
class SchemaAsSent:
    """One dialect of a version's output schema: the providers sent it, the schema as they get it,
    and what only the ledger's own check reads."""

    label: str
    providers: list[str]
    schema_json: str
    left_to_ledger: tuple[LeftToLedger, ...]


def schemas_as_sent(prompt: PromptVersion) -> list[SchemaAsSent]:
    providers_by_dialect: dict[str, list[str]] = {}
    for name in provider_names():
        providers_by_dialect.setdefault(schema_dialect(name), []).append(name)
    shown = []
    for dialect, providers in providers_by_dialect.items():
        sent = sent_schema(prompt.output_schema, dialect)
        shown.append(
            SchemaAsSent(DIALECT_LABELS[dialect], providers, pretty_json(sent.schema), sent.left_to_ledger)
        )
    return shown


# How each provider's adapter writes one request, and where in what it sends that request stands.
REQUEST_WRITERS = {
    "openai": (openai.request_line, "a line of the batch input file (one line a request)"),
    "emulator": (openai.request_line, "a line of the batch input file (one line a request)"),
    "anthropic": (anthropic.batch_request, "an entry of the batch's requests"),
    "gemini": (
        gemini.inline_request,
        "an entry of the batch's inline requests (a unit too large to go inline carries the same "
        "request as a line of an uploaded file)",
    ),
    "cloudflare": (cloudflare.queued_request, "an entry of the queued requests"),
    "openai_compatible": (
        lambda request: openai_compatible.request_body(request, schema_dialect("openai_compatible")),
        "the body of one POST to the server's /chat/completions",
    ),
}


@dataclass(frozen=True)
class Preview:
    product: Product
    provider: str
    where: str
    user_message: str
    request_json: str


def preview_request(prompt: PromptVersion, product: Product, provider: str, model: str) -> Preview:
    """The request exactly as `provider`'s adapter would send it for this product's current revision."""
    write, where = REQUEST_WRITERS[provider]
    user_message = render_user_message(prompt, product.current_revision)
    request = write(
        InferenceRequest(
            custom_id=PREVIEW_CUSTOM_ID,
            model=model,
            system_message=prompt.system_message,
            user_message=user_message,
            output_schema=prompt.output_schema,
            max_output_tokens=prompt.max_output_tokens,
        )
    )
    return Preview(product, provider, where, user_message, pretty_json(request))


@dataclass(frozen=True)
class PartDiff:
    """One part of a version beside the same part of the current version: `lines` of a unified diff
    as (kind, text), kind "delete", "insert", "hunk" or "equal". Plain text: the template escapes it."""

    name: str
    lines: list[tuple[str, str]]


DIFF_KINDS = {"-": "delete", "+": "insert", "@": "hunk", " ": "equal"}


def parts_of(prompt: PromptVersion) -> dict[str, str]:
    return {
        "System message": prompt.system_message,
        "Template": prompt.template,
        # In its author's order: a version that only reorders properties changes what a model writes.
        "Output schema": pretty_json(prompt.output_schema),
        "Validation rules": json.dumps(prompt.rules, indent=2, ensure_ascii=False, sort_keys=True),
        "Max output tokens": str(prompt.max_output_tokens),
    }


def diff_against(current: PromptVersion, prompt: PromptVersion) -> list[PartDiff]:
    """What `prompt` changes from `current`, part by part; parts that are the same are left out."""
    before, after = parts_of(current), parts_of(prompt)
    diffs = []
    for name in before:
        if before[name] == after[name]:
            continue
        lines = difflib.unified_diff(
            before[name].splitlines(), after[name].splitlines(), str(current), str(prompt), lineterm=""
        )
        shown = [(DIFF_KINDS.get(line[:1], "equal"), line) for line in lines]
        diffs.append(PartDiff(name, shown[2:]))  # the two file-name lines say what the heading says
    return diffs


def detail_context(request: HtmxHttpRequest, prompt: PromptVersion) -> dict:
    """What the version's page shows besides the preview: whether it is current, who made which
    version current and when, and its differences from the current version."""
    history = list(
        CurrentPromptChoice.objects.filter(task=prompt.task)
        .select_related("prompt_version", "replaced")
        .order_by("-pk")[:CHOICES_SHOWN]
    )
    current_choice = history[0] if history else None
    current = current_choice.prompt_version if current_choice else None
    return {
        "prompt": prompt,
        "is_current": current == prompt,
        "current": current,
        "current_choice": current_choice,
        "history": history,
        "diff": diff_against(current, prompt) if current and current != prompt else [],
        "schema_json": pretty_json(prompt.output_schema),
        "rules_json": pretty_json(prompt.rules),
        "schemas_as_sent": schemas_as_sent(prompt),
        "can_create": has_role(request.user, *APPROVERS),
    }


# The page lists a task's latest choices of its current version.
CHOICES_SHOWN = 10


@require_GET
@login_required
@role_required(*VIEWERS)
def prompt_detail(request: HtmxHttpRequest, prompt_id: int) -> HttpResponse:
    prompt = get_object_or_404(PromptVersion.objects.annotate(jobs_using=Count("jobs")), pk=prompt_id)
    preview_form = PromptPreviewForm(request.GET if "sku" in request.GET else None)
    preview = None
    if preview_form.is_valid():
        sku = preview_form.cleaned_data["sku"].strip()
        product = Product.objects.select_related("current_revision").filter(sku=sku).first()
        if product is None:
            preview_form.add_error("sku", f"No product has the SKU “{sku}”.")
        else:
            data = preview_form.cleaned_data
            preview = preview_request(prompt, product, data["provider"], data["model"])
    context = {**detail_context(request, prompt), "preview_form": preview_form, "preview": preview}
    if wants_partial(request):
        return render(request, "prompt_detail.html#preview", context)
    return render(request, "prompt_detail.html", context)


def source_version(request: HtmxHttpRequest) -> PromptVersion | None:
    """The version a new one starts from: `?from=<id>`, if given."""
    wanted = request.GET.get("from", "")
    if not wanted:
        return None
    if (prompt_id := parse_id(wanted)) is None:
        raise Http404("No such prompt version")
    return get_object_or_404(PromptVersion, pk=prompt_id)


@require_http_methods(["GET", "POST"])
@login_required
@role_required(*VIEWERS)
def prompt_new(request: HtmxHttpRequest) -> HttpResponse:
    source = source_version(request)
    can_create = has_role(request.user, *APPROVERS)
    context = {"source": source, "can_create": can_create}
    if request.method == "GET":
        return render(request, "prompt_new.html", {**context, "form": PromptVersionForm(source=source)})
    if not can_create:
        raise PermissionDenied
    form = PromptVersionForm(request.POST, source=source)
    if not form.is_valid():
        return render(request, "prompt_new.html", {**context, "form": form}, status=400)
    data = form.cleaned_data
    try:
        prompt = create_prompt_version(
            task=data["task"],
            system_message=data["system_message"],
            template=data["template"],
            output_schema=data["output_schema"],
            rules=data["rules"],
            max_output_tokens=data["max_output_tokens"],
            rejection_reasons=data["rejection_reasons"],
        )
    except NotAllowed as exc:
        form.add_error(None, str(exc))
        return render(request, "prompt_new.html", {**context, "form": form}, status=400)
    current = PromptVersion.objects.filter(task=prompt.task).current().first()
    messages.success(
        request,
        f"Created {prompt}. Earlier versions are unchanged. It is not current: jobs that name no version "
        + (f"go on using {current}" if current else "cannot start until a version is current")
        + "; make it current below when it is ready.",
    )
    return redirect("prompt_detail", prompt.pk)


@require_POST
@login_required
@role_required(*APPROVERS)
def prompt_make_current(request: HtmxHttpRequest, prompt_id: int) -> HttpResponse:
    """Make this version the one jobs naming no version use. The form carries the version that was
    current when the page was shown (`replacing`): sent again after someone else chose, it is refused."""
    prompt = get_object_or_404(PromptVersion.objects.annotate(jobs_using=Count("jobs")), pk=prompt_id)
    seen = request.POST.get("replacing", "")
    replacing = parse_id(seen) if seen else None
    if seen and replacing is None:
        return refused(request, prompt, "The form is not one this page sent; look again.", status=400)
    try:
        _, made = make_prompt_current(prompt=prompt, actor=request.user, replacing=replacing)
    except NotAllowed as refusal:
        return refused(request, prompt, str(refusal), status=409)
    if made:
        messages.success(request, f"{prompt} is now current: jobs that name no version use it.")
    else:
        messages.info(request, f"{prompt} was current already; nothing changed.")
    return redirect("prompt_detail", prompt.pk)


def refused(request: HtmxHttpRequest, prompt: PromptVersion, message: str, *, status: int) -> HttpResponse:
    """The version's page again, with why it was not made current."""
    context = {
        **detail_context(request, prompt),
        "preview_form": PromptPreviewForm(),
        "preview": None,
        "refusal": message,
    }
    return render(request, "prompt_detail.html", context, status=status)
