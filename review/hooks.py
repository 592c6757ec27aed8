"""`POST /hooks/openai` and `POST /hooks/gemini`: the providers' batch webhooks (SPEC §6). No login
and no CSRF token: the Standard Webhooks signature over the raw body, keyed by the provider's
secret from the environment, is the authentication. What a signed event does is
`ledger.notices.provider_hooks.take_hint`; here is only HTTP.

Answers, in the API's error shape: 404 while the provider's secret is unset (the hook is off),
405 for another method, 413 for a body larger than a provider's event, 400 for a bad, missing or
stale signature; a correctly signed event 200 whatever it names (the provider would otherwise
retry it for a day), 200 for a `webhook-id` seen before, which changes nothing."""

import json

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from ledger.notices import provider_hooks
from ledger.notices.signed_webhooks import BadSignature, check_signature

from .api import ApiError


@csrf_exempt
def openai_hook(request: HttpRequest) -> HttpResponse:
    return receive(request, "openai")


@csrf_exempt
def gemini_hook(request: HttpRequest) -> HttpResponse:
    return receive(request, "gemini")


def receive(request: HttpRequest, provider: str) -> HttpResponse:
    secret = provider_hooks.secret(provider)
    if not secret:
        return ApiError(404, "not_found", f"No {provider} webhook is set up here").response()
    if request.method != "POST":
        response = ApiError(405, "method_not_allowed", f"{request.method} is not allowed here").response()
        response["Allow"] = "POST"
        return response
    body = read_body(request)
    if body is None:
        return ApiError(
            413, "too_large", f"A webhook body is at most {provider_hooks.MAX_BODY_BYTES} bytes"
        ).response()
    try:
        webhook_id = check_signature(secret, body, request.headers)
    except BadSignature:
        # Which part failed is not said: a forger learns nothing from the answer.
        return ApiError(
            400,
            "bad_signature",
            "The webhook-id, webhook-timestamp and webhook-signature headers do not sign this body "
            "with this hook's secret within five minutes",
        ).response()
    if len(webhook_id) > provider_hooks.MAX_REF_LENGTH:
        return ApiError(
            400, "invalid", "The webhook-id is too long", {"webhook-id": "At most 256 characters"}
        ).response()
    try:
        event = json.loads(body)
    except (ValueError, RecursionError):
        event = None  # signed, so recorded; it names no batch
    outcome = provider_hooks.take_hint(provider=provider, webhook_id=webhook_id, event=event)
    return JsonResponse({"received": True, "repeated": outcome is None, "outcome": outcome or ""})


def read_body(request: HttpRequest) -> bytes | None:
    """The raw body, or None when it is larger than a provider's event: refused by its declared
    length before anything is read, and never read past the limit.

    A body sent in chunks has no Content-Length, and Django reads such a body as empty: a correctly
    signed event would fail its signature. Where the server has read the chunks to their end
    (`wsgi.input_terminated`, as gunicorn does), the body is read from the server's stream itself."""
    limit = provider_hooks.MAX_BODY_BYTES
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        return None
    if not request.META.get("CONTENT_LENGTH") and request.META.get("wsgi.input_terminated"):
        body = request.META["wsgi.input"].read(limit + 1)
    else:
        body = request.read(limit + 1)
    return None if len(body) > limit else body
