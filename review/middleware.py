"""Per-request settings that follow the person: the time zone every screen shows times in."""

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from .models import Preferences


class PreferencesMiddleware:
    """Reads the signed-in person's preferences once (`request.preferences`) and activates their time
    zone for the request, so every `when` and `date` shows local time. After authentication."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request.preferences = Preferences.of(request.user)
        timezone.activate(request.preferences.zone)
        try:
            return self.get_response(request)
        finally:
            timezone.deactivate()
