"""Per-request settings that follow the person (the time zone every screen shows times in), and what a
person whose session expired meets instead of a blank page or a log-in page inside a card."""

from collections.abc import Callable
from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render, resolve_url
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme

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


class HtmxLogIn:
    """A request sent by htmx (a decision on the desk, a page's polling) once the session has expired
    is sent to the log-in page by `login_required`. The browser's XMLHttpRequest follows that redirect
    itself, and htmx swapped the whole log-in page into the card or the progress box. Instead the
    browser goes to the log-in page (HX-Redirect), which returns the person to the page they were on,
    not to the address the form was sent to: nothing was decided, and they decide again."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        login = resolve_url(settings.LOGIN_URL)
        if request.headers.get("HX-Request") != "true" or response.status_code != 302:
            return response
        if urlsplit(response["Location"]).path != login:
            return response
        here = urlsplit(request.headers.get("HX-Current-URL", ""))
        back = here.path + (f"?{here.query}" if here.query else "")
        if not (back.startswith("/") and url_has_allowed_host_and_scheme(back, allowed_hosts=None)):
            back = "/"
        answer = HttpResponse(status=204)
        answer["HX-Redirect"] = f"{login}?{urlencode({'next': back})}"
        return answer
