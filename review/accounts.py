"""Signing in: who may use a password, which address a log-in comes from, what a failed one counts
against, and how many tries are left (the throttle is django-axes; its settings are in
batchdesk/settings.py). The company's OpenID Connect sign-in is review/company_sign_in.py."""

from dataclasses import dataclass

from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.forms import AuthenticationForm
from django.db.models import Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from . import company_sign_in


class PasswordBackend(ModelBackend):
    """Django's password check, while local passwords are on. With BATCHDESK_LOCAL_LOGIN=0 only a
    superuser's password opens (break-glass admins): anyone else's, right or wrong, is a failed
    log-in like any other (counted by django-axes, answered with the same words, so it does not tell
    a right password from a wrong one), on the log-in page and the admin's alike. Sessions opened
    with a password before passwords were turned off end at their next request."""

    def user_can_authenticate(self, user) -> bool:
        return super().user_can_authenticate(user) and (settings.BATCHDESK_LOCAL_LOGIN or user.is_superuser)


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


# The longest user name a failed log-in is recorded under: django-axes' AccessAttempt.username column.
RECORDED_USERNAME_LENGTH = 255


def attempted_username(request: HttpRequest, credentials: dict | None = None) -> str | None:
    """The user name a log-in tried (django-axes' AXES_USERNAME_CALLABLE), as axes reads it, cut to
    the column it is recorded in. The log-in forms take a name of any length (AuthenticationForm
    checks none before authenticating), and one longer than any user name can be is nobody's: counted
    cut, rather than failing the whole log-in with a database error (500)."""
    if credentials:
        username = credentials.get(settings.AXES_USERNAME_FORM_FIELD)
    else:
        username = request.POST.get(settings.AXES_USERNAME_FORM_FIELD)
    return username[:RECORDED_USERNAME_LENGTH] if isinstance(username, str) else username


def lockout_minutes() -> int:
    return round(settings.AXES_COOLOFF_TIME.total_seconds() / 60)


def failures(**who: str) -> int:
    """Failed log-ins still counted (within the lock-out window) for `who`: a username or an ip_address."""
    since = timezone.now() - settings.AXES_COOLOFF_TIME
    counted = AccessAttempt.objects.filter(attempt_time__gte=since, **who)
    return counted.aggregate(n=Sum("failures_since_start"))["n"] or 0


def lockout_parameters(request: HttpRequest, credentials: dict | None = None) -> list:
    """What failed log-ins are counted against (django-axes' AXES_LOCKOUT_PARAMETERS), each locking at
    AXES_FAILURE_LIMIT: the user name, from any address, and the (user name, address) pair; the address
    alone only once it has failed BATCHDESK_LOGIN_ADDRESS_FAILURE_LIMIT times, so that one person's
    mistakes behind an office's shared address lock nobody else out."""
    parameters: list = ["username", ["username", "ip_address"]]
    address = getattr(request, "axes_ip_address", None) or client_address(request)
    if failures(ip_address=address) >= settings.BATCHDESK_LOGIN_ADDRESS_FAILURE_LIMIT:
        parameters.append("ip_address")
    return parameters


@dataclass(frozen=True)
class TriesLeft:
    """How many failed log-ins are left before the throttle holds, and for what: the user name, or
    the address when the address is nearer its own limit."""

    count: int
    for_address: bool

    @property
    def minutes(self) -> int:
        return lockout_minutes()


def tries_left(request: HttpRequest, username: str) -> TriesLeft:
    by_name = settings.AXES_FAILURE_LIMIT - failures(username=username)
    by_address = settings.BATCHDESK_LOGIN_ADDRESS_FAILURE_LIMIT - failures(ip_address=client_address(request))
    return TriesLeft(count=max(0, min(by_name, by_address)), for_address=by_address < by_name)


class LoginForm(AuthenticationForm):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not settings.BATCHDESK_LOCAL_LOGIN:
            self.error_messages = {
                **self.error_messages,
                "invalid_login": "Passwords open only the break-glass administrators' accounts, and this is "
                "not a correct user name and password of one. Everyone else signs in with "
                + company_sign_in.company_name()
                + ".",
            }


class LoginView(auth_views.LoginView):
    """Django's log-in page, with the company's sign-in when it is configured; after a failed try it
    says how many are left before logging in pauses."""

    form_class = LoginForm

    def get_context_data(self, **kwargs) -> dict:
        return {
            **super().get_context_data(**kwargs),
            "company_sign_in": company_sign_in.configured(),
            "company_name": company_sign_in.company_name(),
            "local_login": settings.BATCHDESK_LOCAL_LOGIN,
        }

    def form_invalid(self, form) -> HttpResponse:
        username = form.cleaned_data.get("username")
        left = tries_left(self.request, username) if username and form.non_field_errors() else None
        return self.render_to_response(self.get_context_data(form=form, tries_left=left))


def locked_out(
    request: HttpRequest, original_response: HttpResponse | None, credentials: dict | None
) -> HttpResponse:
    """The login screen's answer while the throttle holds: 429, saying which lock holds and for how long."""
    username = (credentials or {}).get("username") or request.POST.get("username", "")
    context = {
        "username": username,
        "by_name": bool(username) and failures(username=username) >= settings.AXES_FAILURE_LIMIT,
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "address_failure_limit": settings.BATCHDESK_LOGIN_ADDRESS_FAILURE_LIMIT,
        "minutes": lockout_minutes(),
    }
    return render(request, "registration/locked_out.html", context, status=429)
