"""Per-request settings that follow the person: the time zone every screen shows times in."""

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
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


class FormOnlyAddressPage:
    """A screen's address that only takes a form (approve, reject, confirm an import, make a prompt
    version current…) opened by its address answers Django's 405 with an empty body: a blank page.
    That is what a person sees after a form sent with an expired session: the log-in page returns
    them to the form's address by GET, and the decision they had sent is not made. Such an answer
    becomes a page in the layout saying nothing was done. Under /api/ the API answers in JSON itself."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code != 405 or response.content or request.path_info.startswith("/api/"):
            return response
        page = render(request, "405.html", status=405)
        page["Allow"] = response.get("Allow", "")
        return page
