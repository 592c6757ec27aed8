"""Signing in: which address a login attempt comes from, for the throttle (django-axes)."""

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def client_address(request: HttpRequest) -> str:
    """The address a login attempt comes from.

    Behind the TLS proxy (BATCHDESK_HTTPS) every request arrives from the proxy, so its address would
    lock everybody out at once: the proxy appends the address it saw to X-Forwarded-For, and the last
    entry is the only one a client cannot forge."""
    if settings.BATCHDESK_HTTPS:
        forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "").rsplit(",", 1)[-1].strip()
        if forwarded:
            return forwarded
    return request.META.get("REMOTE_ADDR", "")


def locked_out(
    request: HttpRequest, original_response: HttpResponse | None, credentials: dict | None
) -> HttpResponse:
    """The login screen's answer while the throttle holds: 429, saying why and for how long."""
    context = {
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "minutes": round(settings.AXES_COOLOFF_TIME.total_seconds() / 60),
    }
    return render(request, "registration/locked_out.html", context, status=429)
