"""An item's page (SPEC §8): its source revision, every generated version with its cost and its
difference from the published text, approvals, attempts at the destination and events; the decision
on its draft (posted to the desk's approve and reject), and, for an operator, a new draft asked for
with the prompt version they choose."""

import uuid
from dataclasses import dataclass
from decimal import Decimal

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from ledger.actions import NotAllowed, currency_problem
from ledger.actions.reviewing import REGENERABLE_STATES, last_decision, regenerate_with_prompt
from ledger.models import GeneratedVersion, Item, PromptVersion
from ledger.money.estimates import request_estimate, work_cost
from ledger.money.pricing import is_apportioned, price_for, unknown_price, version_cost
from ledger.states import DECIDABLE_STATES, STOPS, ItemState, JobState

from .common import HtmxHttpRequest, fields_of, form_errors, refused_page, word_diff
from .desk import UndoOffer, undo_offer
from .forms import RegenerateForm
from .permissions import APPROVERS, OPERATOR, VIEWERS, has_role, role_required
from .queue import published_text


@dataclass(frozen=True)
class VersionView:
    """One generated version on the item page, with what it cost and how it differs from the published text."""

    version: GeneratedVersion
    cost: Decimal | None  # None: the job's model has no known price
    diff: list[tuple[str, str]]

    @property
    def apportioned(self) -> bool:
        return is_apportioned(self.version)

    @property
    def price_note(self) -> str:
        job = self.version.item.job
        return unknown_price(job.provider, job.model)


@require_GET
@login_required
@role_required(*VIEWERS)
def item_detail(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    item = get_object_or_404(
        Item.objects.select_related(
            "job__prompt_version",
            "product__current_revision",
            "product__published_version",
            "source_revision",
        ),
        pk=item_id,
    )
    versions = list(item.versions.order_by("number"))
    published = published_text(item)
    for version in versions:
        version.item = item  # the job, for its price, without a query per version
    latest = versions[-1] if versions else None
    product = item.product
    current = product.current_revision if product.current_revision_id != item.source_revision_id else None
    # Waiting for review: approve (the text as it stands in the box, judged like a draft) or reject.
    # Unusable (validation_failed): an owner may edit the draft into a valid text and approve it.
    can_decide = item.state in DECIDABLE_STATES and latest is not None and has_role(request.user, *APPROVERS)
    currency = currency_problem(item) if can_decide else None
    context = {
        "item": item,
        "product": product,
        "source_fields": fields_of(item.source_revision),
        "current_revision": current,
        "current_fields": fields_of(current) if current else [],
        "revision_note": STOPS[ItemState.OBSOLETE].event,
        "versions": [
            VersionView(v, version_cost(v), [] if v.content_expired_at else word_diff(published, v.content))
            for v in versions
        ],
        "latest": latest,
        "approvals": item.approvals.select_related("approved_by", "version").order_by("approved_at", "id"),
        "attempts": item.destination_attempts.select_related("version").order_by("started_at", "id"),
        "events": item.events.order_by("id"),
        "can_decide": can_decide,
        "can_reject": can_decide and item.state == ItemState.AWAITING_REVIEW,
        "regenerate_choices": regenerate_choices(item) if may_regenerate(request.user, item) else [],
        "approve_refusal": STOPS[currency].note if currency else "",
        "undo": undo_on_page(request.user, item),
        "comments": list(item.comments.select_related("author")),
        "comment_token": uuid.uuid4(),
    }
    return render(request, "item_detail.html", context)


def undo_on_page(user, item: Item) -> UndoOffer | None:
    """The undo the person may still use on their last decision here, or why not: only while the item
    is still as their decision left it (once it moved on, the timeline says what happened)."""
    decision = last_decision(item, user) if has_role(user, *APPROVERS) else None
    if decision is None or item.state != decision.to_state:
        return None
    return undo_offer(user, item)


def may_regenerate(user, item: Item) -> bool:
    return (
        item.state in REGENERABLE_STATES and item.job.state != JobState.CANCELLED and has_role(user, OPERATOR)
    )


@dataclass(frozen=True)
class PromptChoice:
    """A prompt version an unusable or rejected draft may be asked again with, and what one request
    with it is expected to cost (the provider's currency; None without a known price) and on what
    that rests, in words (`ledger.money.estimates`)."""

    prompt: PromptVersion
    cost: Decimal | None
    used: bool  # the version the draft was written with
    estimate_source: str


def regenerate_choices(item: Item) -> list[PromptChoice]:
    job = item.job
    price = price_for(job.provider, job.model)
    sample = [(item.product.current_revision.title, item.product.current_revision.fields)]
    choices = []
    for prompt in PromptVersion.objects.filter(task=job.task).order_by("-version"):
        per_request = request_estimate(prompt, sample, provider=job.provider, model=job.model)
        choices.append(
            PromptChoice(
                prompt,
                work_cost(price, 1, per_request),
                prompt.pk == job.prompt_version_id,
                per_request.source,
            )
        )
    return choices


@require_POST
@login_required
@role_required(OPERATOR)
def regenerate(request: HtmxHttpRequest, item_id: int) -> HttpResponse:
    """Ask for a new draft of an unusable or rejected item with the prompt version the operator chose:
    a one-item job (a job has one prompt version). The same form sent again shows the job it started."""
    item = get_object_or_404(Item.objects.select_related("product", "job"), pk=item_id)
    form = RegenerateForm(request.POST)
    back = reverse("item_detail", args=[item.pk])
    if not form.is_valid():
        return refused_page(request, form_errors(form), back)
    version = form.cleaned_data["prompt_version"]
    try:
        job, started = regenerate_with_prompt(item_id=item.pk, prompt_version=version, actor=request.user)
    except NotAllowed as exc:
        messages.error(request, f"{item.product.sku}: nothing was started. {exc}")
        return redirect(back)
    if started:
        messages.success(
            request,
            f"{item.product.sku}: a new draft is asked for with prompt version {version} in job {job.reference}.",
        )
    else:
        messages.info(
            request,
            f"{item.product.sku} was regenerated with prompt version {version} already: job {job.reference}.",
        )
    return redirect("job_detail", job.pk)
