"""Webhook destinations (SPEC §6). Placeholder until the webhook work lands: refuses every call."""

from ..models import AttemptOutcome
from .base import Destination, DestinationResult


class WebhookDestination(Destination):
    def __init__(self, *, name: str, url: str, token: str = ""):
        self.name, self.url, self.token = name, url, token

    def apply(self, *, item, version, approval, operation_key) -> DestinationResult:
        return DestinationResult(AttemptOutcome.REJECTED, "Webhook destinations are not implemented yet")
