"""Drafts waiting for review, and products moving on under them, as the desk's and the list's tests
make them (review/queue.py: what both screens show)."""

from datetime import timedelta

from django.utils import timezone

from ledger.models import Approval, Event, GeneratedVersion, Item, Job, Product, ProductStatus, SourceRevision
from tests.factories import ItemFactory, add_version


def queue_of(n: int, job: Job | None = None) -> list[GeneratedVersion]:
    """`n` drafts waiting for review, oldest first, each with its own recognisable text."""
    now = timezone.now()
    drafts = []
    for i in range(n):
        item = ItemFactory(awaiting_review=True, **({"job": job} if job else {}))
        drafts.append(add_version(item, f"Draft number {i + 1} of the queue, about {item.product.sku}."))
        Item.objects.filter(pk=item.pk).update(updated_at=now - timedelta(minutes=n - i))
    return drafts


def revise(product: Product) -> None:
    """A new revision the ledger has not reacted to yet (as in the moment between a change and its effects)."""
    revision = SourceRevision.objects.create(
        product=product, number=2, title="Walnut board", fields={"material": "walnut"}, content_hash="r2" * 32
    )
    Product.objects.filter(pk=product.pk).update(current_revision=revision)


def withdraw(product: Product) -> None:
    Product.objects.filter(pk=product.pk).update(status=ProductStatus.WITHDRAWN)


def snapshot(item: Item) -> tuple:
    item.refresh_from_db()
    return item.state, item.approved_version_id, Approval.objects.count(), Event.objects.count()
