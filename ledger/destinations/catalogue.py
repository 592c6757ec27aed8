"""The built-in destination: publish the approved text onto the product in BatchDesk itself."""

from django.db import transaction
from django.utils import timezone

from ..models import AttemptOutcome, Product, ProductStatus, Publication
from ..states import STOPS, ItemState
from .base import Destination, DestinationResult


class CatalogueDestination(Destination):
    name = "catalogue"

    def apply(self, *, item, version, approval, operation_key) -> DestinationResult:
        with transaction.atomic():
            product = Product.objects.select_for_update().get(pk=item.product_id)
            if Publication.objects.filter(operation_key=operation_key).exists():
                # Published by an earlier attempt whose worker died before recording it: confirm only,
                # even if a newer text has been published since.
                return DestinationResult(AttemptOutcome.APPLIED, "Already published by an earlier attempt")
            # The same guards again, under the product's row lock, for a change made a moment ago.
            if product.status != ProductStatus.ACTIVE:
                return DestinationResult(
                    AttemptOutcome.REFUSED_BY_GUARD, STOPS[ItemState.WITHDRAWN].not_published
                )
            if product.current_revision_id != item.source_revision_id:
                return DestinationResult(
                    AttemptOutcome.REFUSED_BY_GUARD, STOPS[ItemState.OBSOLETE].not_published
                )
            product.published_content = approval.final_content
            product.published_version = version
            product.published_revision = item.source_revision.number
            product.published_at = timezone.now()
            Publication.objects.create(
                product=product, version=version, operation_key=operation_key, content=approval.final_content
            )
            product.save(
                update_fields=[
                    "published_content",
                    "published_version",
                    "published_revision",
                    "published_at",
                    "updated_at",
                ]
            )
        return DestinationResult(AttemptOutcome.APPLIED, "Published on the product")
