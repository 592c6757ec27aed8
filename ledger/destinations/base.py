"""Where approved text goes. Every destination applies under the same guards (SPEC §3 rule 5)."""

from ..models import Approval, DestinationAttempt, GeneratedVersion, Item


class Destination:
    name: str = ""

    def apply(
        self,
        *,
        item: Item,
        version: GeneratedVersion,
        approval: Approval,
        operation_key: str,
        attempt: DestinationAttempt,
    ) -> str:
        """Apply the approved text, record the attempt's outcome and move the item. Return the outcome."""
        raise NotImplementedError
