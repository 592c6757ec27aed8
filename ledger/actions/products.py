"""Products: new content makes a revision, and every unapplied item of a revised or withdrawn
product stops at once (SPEC §2, rule 5)."""

from dataclasses import dataclass

from django.db import transaction

from ..models import AttemptOutcome, Item, Product, ProductStatus, SourceRevision
from ..states import ItemState, sources_for
from .core import NotAllowed, enqueue
from .job_states import refresh_job_state
from .jobs import judge_currency


@dataclass
class ProductChange:
    created: bool = False
    revised: bool = False
    withdrawn: bool = False


def record_product(
    *, sku: str, title: str, fields: dict, status: str | None = None, actor=None
) -> ProductChange:
    """Create or revise one product. Identical content makes no revision; status is not content.
    Items already at work on the product are told at once where they can stop (see below)."""
    change = ProductChange()
    digest = SourceRevision.hash_content(title, fields)
    with transaction.atomic():
        product, change.created = Product.objects.select_for_update().get_or_create(sku=sku)
        current = product.current_revision
        if current is None or current.content_hash != digest:
            number = (current.number if current else 0) + 1
            product.current_revision = SourceRevision.objects.create(
                product=product, number=number, title=title, fields=fields, content_hash=digest
            )
            change.revised = not change.created
        if status == ProductStatus.WITHDRAWN and product.status != ProductStatus.WITHDRAWN:
            change.withdrawn = True
        if status:
            product.status = status
        product.save()
        if change.withdrawn:
            stop_withdrawn_items(product, actor=actor)
        elif change.revised:
            retire_stale_items(product, actor=actor)
    return change


def stop_withdrawn_items(product: Product, *, actor=None) -> None:
    """Every unapplied item of a withdrawn product stops now (rule 5), except those at the provider
    (judged when their result returns) and those being applied (judged before their next attempt)."""
    stop_unapplied_items(product.items.all(), to=ItemState.WITHDRAWN, actor=actor)


def retire_stale_items(product: Product, *, actor=None) -> None:
    """Every unapplied item of an older revision becomes obsolete now and the current revision is
    queued in its job; those at the provider or being applied when they are next judged."""
    stale = product.items.exclude(source_revision_id=product.current_revision_id)
    stop_unapplied_items(stale, to=ItemState.OBSOLETE, actor=actor)


def stop_unapplied_items(items, *, to: str, actor=None) -> None:
    # A prepared item in an intent not sent yet stops too: the intent sends only prepared items.
    stopping = items.filter(state__in=sources_for(to) - {ItemState.APPLYING})
    jobs = set()
    for item in stopping:
        try:
            judge_currency(item, actor=actor)
        except NotAllowed:
            continue  # it moved on meanwhile (say, to the provider); it is judged where it is now
        jobs.add(item.job_id)
    # Applications waiting for a retry are judged now rather than after their backoff; one whose
    # attempt is in flight keeps its lease and is judged before its next attempt.
    waiting = items.filter(state=ItemState.APPLYING).exclude(
        destination_attempts__outcome=AttemptOutcome.STARTED
    )
    for item_id in waiting.values_list("pk", flat=True):
        Item.objects.filter(pk=item_id, state=ItemState.APPLYING).update(next_attempt_at=None)
        enqueue("ledger.tasks.apply_item", item_id)
    for job_id in jobs:
        refresh_job_state(job_id)


def withdraw_product(*, sku: str, actor=None) -> Product:
    """Withdraw a product: nothing is published for it from now on, at any step."""
    with transaction.atomic():
        product = Product.objects.select_for_update().get(sku=sku)
        revision = SourceRevision.objects.get(pk=product.current_revision_id)
        record_product(
            sku=sku, title=revision.title, fields=revision.fields, status=ProductStatus.WITHDRAWN, actor=actor
        )
    return Product.objects.get(sku=sku)
