"""A drilling pilot's destination (`ledger.pilots.drill`, the destination timeout): the job's own
destination, whose answer to the drill's attempt is lost on the way back after it acted."""

from ..models import Approval, AttemptOutcome, GeneratedVersion, Item
from ..pilots.drill import LOST_ANSWER, answer_lost
from .base import Destination, DestinationResult


class DrillingDestination(Destination):
    def __init__(self, destination: Destination):
        self.destination = destination
        self.name = destination.name

    def apply(
        self, *, item: Item, version: GeneratedVersion, approval: Approval, operation_key: str
    ) -> DestinationResult:
        result = self.destination.apply(
            item=item, version=version, approval=approval, operation_key=operation_key
        )
        if result.outcome == AttemptOutcome.APPLIED and answer_lost(item, operation_key):
            # The destination acted, and its answer is lost on the way back, as when a call times out.
            return DestinationResult(AttemptOutcome.RETRYABLE, LOST_ANSWER)
        return result
