"""`POST /hooks/openai` and `POST /hooks/gemini`: the providers' batch webhooks (SPEC §6). The door
(`ProviderSignature`) lets in a body the provider's secret signs; what a signed event does is
`ledger.notices.provider_hooks.take_hint`; here is only HTTP.

Answers, in the API's error shape: 404 while the provider's secret is unset (the hook is off),
405 for another method, 413 for a body larger than a provider's event, 400 for a bad, missing or
stale signature (all the door's); a correctly signed event 200 whatever it names (the provider would
otherwise retry it for a day), 200 for a `webhook-id` seen before, which changes nothing."""

import json

from django.http import HttpRequest, HttpResponse, JsonResponse

from ledger.notices import provider_hooks

from .doors import NO_ROLE, ProviderSignature, SignedDelivery, door
from .errors import ApiError


@door(ProviderSignature("openai"), POST=NO_ROLE)
def openai_hook(request: HttpRequest) -> HttpResponse:
    return receive(request.delivery)


@door(ProviderSignature("gemini"), POST=NO_ROLE)
def gemini_hook(request: HttpRequest) -> HttpResponse:
    return receive(request.delivery)


def receive(delivery: SignedDelivery) -> HttpResponse:
    if len(delivery.webhook_id) > provider_hooks.MAX_REF_LENGTH:
        raise ApiError(400, "invalid", "The webhook-id is too long", {"webhook-id": "At most 256 characters"})
    try:
        event = json.loads(delivery.body)
    except (ValueError, RecursionError):
        event = None  # signed, so recorded; it names no batch
    outcome = provider_hooks.take_hint(
        provider=delivery.provider, webhook_id=delivery.webhook_id, event=event
    )
    return JsonResponse({"received": True, "repeated": outcome is None, "outcome": outcome or ""})
