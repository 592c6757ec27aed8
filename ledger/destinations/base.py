"""Where approved text goes. A destination only delivers (the drill's wrapper may lose the answer on
the way back); `actions.applying.apply_item` checks the guards before each attempt, records the
attempt and moves the item (SPEC §3 rules 5 and 7)."""

from dataclasses import dataclass

from ..drafts.scrubbing import scrub_credentials
from ..models import Approval, AttemptOutcome, GeneratedVersion, Item


@dataclass(frozen=True)
class DestinationResult:
    outcome: str  # an AttemptOutcome: applied, retryable, rejected or refused_by_guard
    message: str
    retry_after: float | None = None
    # A ReasonCode when the ledger should group this refusal apart from "the destination refused".
    code: str = ""

    def __post_init__(self):
        # The destination's words are stored as the attempt's response and the item's reason:
        # scrubbed here, whichever destination said them (SPEC §4).
        object.__setattr__(self, "message", scrub_credentials(self.message))


class Destination:
    name: str = ""

    def apply(
        self, *, item: Item, version: GeneratedVersion, approval: Approval, operation_key: str
    ) -> DestinationResult:
        """Deliver the approved text once per operation key; say what happened."""
        raise NotImplementedError


__all__ = ["AttemptOutcome", "Destination", "DestinationResult"]
