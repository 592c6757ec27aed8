"""The built-in destination: publish the approved text onto the product in BatchDesk itself."""

from django.db import transaction
from django.utils import timezone

from ..actions import change_state
from ..models import AttemptOutcome, DestinationAttempt, Product, ProductStatus
from ..states import ItemState
from .base import Destination


class CatalogueDestination(Destination):
    name = "catalogue"

    def apply(self, *, item, version, approval, operation_key, attempt) -> str:
        with transaction.atomic():
            product = Product.objects.select_for_update().get(pk=item.product_id)
            if product.published_version_id == version.pk:
                # Applied before with this very key (a worker died after publishing): confirm only.
                outcome, message = AttemptOutcome.APPLIED, "Already published by an earlier attempt"
            elif product.status != ProductStatus.ACTIVE:
                outcome, message = AttemptOutcome.REFUSED_BY_GUARD, "The product was withdrawn"
            elif product.current_revision_id != item.source_revision_id:
                outcome, message = AttemptOutcome.REFUSED_BY_GUARD, "The product changed since approval"
            else:
                now = timezone.now()
                product.published_content = approval.final_content
                product.published_version = version
                product.published_revision = item.source_revision.number
                product.published_at = now
                product.save(
                    update_fields=[
                        "published_content",
                        "published_version",
                        "published_revision",
                        "published_at",
                        "updated_at",
                    ]
                )
                outcome, message = AttemptOutcome.APPLIED, "Published on the product"
            DestinationAttempt.objects.filter(pk=attempt.pk).update(
                outcome=outcome, response=message, finished_at=timezone.now()
            )
            if outcome == AttemptOutcome.APPLIED:
                change_state(item.pk, to=ItemState.APPLIED, reason=message, expect=[ItemState.APPLYING])
                return ItemState.APPLIED
            change_state(
                item.pk, to=ItemState.DESTINATION_REJECTED, reason=message, expect=[ItemState.APPLYING]
            )
            return ItemState.DESTINATION_REJECTED
