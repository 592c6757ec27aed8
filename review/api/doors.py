"""The one door of the API wing (SPEC §6, §8): who is calling, and what role each method needs.

Every view of the wing is wrapped by `door(callers, **roles_by_method)`, and only there is a caller
known and a role checked. The door answers, in the error shape and in this order: 404 when the door
is not there at all (a provider's hook whose secret is unset), 405 for a method it does not list
(with `Allow`), 401 for a caller it cannot name (with a bearer challenge; 400 or 413 for a webhook
whose body or signature is wrong), 403 for a person whose role does not allow the method. Behind it,
an `ApiError` is its answer, the ledger's `NotAllowed` a 409, `Http404` a 404, and a fault of ours a
logged 500 whose traceback is never sent.

Who may call, by role (SPEC §8; admins and superusers may do everything): reading, and `/metrics`:
any role; creating jobs, approving and rejecting, revising and withdrawing products, making a prompt
version current: `catalogue_owner`; retrying and cancelling: `operator` (a catalogue owner may also
cancel a job they own: the view asks `may_cancel`). `/api/health` is open to anyone and says nothing
about the work itself.

A door marks the view it guards (`view.door`), so a test can walk every route and find it.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import wraps

from django.core.exceptions import ImproperlyConfigured
from django.http import Http404, HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from ledger.actions import NotAllowed
from ledger.models import ApiToken
from ledger.notices import provider_hooks
from ledger.notices.signed_webhooks import BadSignature, check_signature

from ..permissions import has_role
from .errors import ApiError, not_found, server_error_response
from .inputs import read_raw_body

# The wing's logger, named as the API's log has always been.
log = logging.getLogger(__package__)

# A token used again within this time is not written again: reading stays free of writes.
LAST_USED_PRECISION = timedelta(minutes=1)
BEARER_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="batchdesk"'}
# The roles asked of a caller that is no person (anyone, a provider).
NO_ROLE: tuple[str, ...] = ()
READING = frozenset({"GET"})


def token_user(request: HttpRequest):
    """The active user whose unexpired, unrevoked token the request carries, or None. Cookies are never
    looked at."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > 256:
        return None
    now = timezone.now()
    found = (
        ApiToken.objects.usable(now).select_related("user").filter(token_hash=ApiToken.hash(token)).first()
    )
    if found is None or not found.user.is_active:
        return None
    if found.last_used_at is None or now - found.last_used_at > LAST_USED_PRECISION:
        ApiToken.objects.filter(pk=found.pk).update(last_used_at=now)
    return found.user


# --- who may knock -------------------------------------------------------------------------


class Callers:
    """Who may knock at a door, and how they are known."""

    # A person must hold one of the roles the method needs; a caller that is no person needs none.
    names_a_person = True
    # Methods it may use. A door that takes a session is exempt from CSRF like every API address, so
    # a session may only read through it.
    methods: frozenset[str] | None = None
    # A fault of ours behind the door: logged and answered in the error shape. Where False, Django's
    # handler500 answers it, as it answers any page.
    answers_faults = True

    def check_open(self, request: HttpRequest) -> None:
        """Raise the ApiError of a door that is not there at all."""

    def identify(self, request: HttpRequest) -> None:
        """Say who calls (`request.user`, or `request.delivery` for a provider), or raise the
        ApiError of a caller it cannot name."""
        raise NotImplementedError


class BearerToken(Callers):
    """API clients: `Authorization: Bearer <token>` (`manage.py create_api_token`). A session cookie
    alone names nobody here, which is why API views need no CSRF protection."""

    def identify(self, request: HttpRequest) -> None:
        user = token_user(request)
        if user is None:
            raise ApiError(
                401,
                "unauthenticated",
                "Send a valid API token: Authorization: Bearer <token>",
                headers=BEARER_CHALLENGE,
            )
        # Whatever the session said, this request acts as the token's user.
        request.user = user


class TokenOrSession(Callers):
    """An API client by its token, or the signed-in person (a read from a screen, like any page). A
    request carrying an Authorization header is judged by its token alone, whatever its cookies say."""

    methods = READING

    def identify(self, request: HttpRequest) -> None:
        if "Authorization" in request.headers:
            user = token_user(request)
        else:
            user = request.user if request.user.is_authenticated and request.user.is_active else None
        if user is None:
            raise ApiError(
                401,
                "unauthenticated",
                "Send a valid API token (Authorization: Bearer <token>) or sign in",
                headers=BEARER_CHALLENGE,
            )
        request.user = user


class Anyone(Callers):
    """No one in particular: what is behind such a door says nothing about the work itself."""

    names_a_person = False

    def identify(self, request: HttpRequest) -> None:
        pass


@dataclass(frozen=True)
class SignedDelivery:
    """A webhook body whose signature the door checked: the provider, its `webhook-id`, the raw body."""

    provider: str
    webhook_id: str
    body: bytes


class ProviderSignature(Callers):
    """A provider's batch webhook (SPEC §6): no login and no CSRF token; the Standard Webhooks
    signature over the raw body, keyed by the provider's secret from the environment, says who calls.
    The door is not there (404) while the secret is unset."""

    names_a_person = False
    # /hooks/ is no API address: a fault of ours there is Django's 500 page, as it always was.
    answers_faults = False

    def __init__(self, provider: str):
        self.provider = provider

    def check_open(self, request: HttpRequest) -> None:
        if not provider_hooks.secret(self.provider):
            raise ApiError(404, "not_found", f"No {self.provider} webhook is set up here")

    def identify(self, request: HttpRequest) -> None:
        body = read_raw_body(request, limit=provider_hooks.MAX_BODY_BYTES)
        if body is None:
            raise ApiError(
                413, "too_large", f"A webhook body is at most {provider_hooks.MAX_BODY_BYTES} bytes"
            )
        try:
            webhook_id = check_signature(provider_hooks.secret(self.provider), body, request.headers)
        except BadSignature:
            # Which part failed is not said: a forger learns nothing from the answer.
            raise ApiError(
                400,
                "bad_signature",
                "The webhook-id, webhook-timestamp and webhook-signature headers do not sign this body "
                "with this hook's secret within five minutes",
            ) from None
        request.delivery = SignedDelivery(self.provider, webhook_id, body)


BEARER_TOKEN = BearerToken()
TOKEN_OR_SESSION = TokenOrSession()
ANYONE = Anyone()


# --- the door ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Door:
    """Who may come in, and the roles each method needs (the methods it lists are all it answers)."""

    callers: Callers
    roles_by_method: dict[str, tuple[str, ...]]

    def let_in(self, request: HttpRequest) -> None:
        """Return when the request may go on; otherwise raise the door's answer."""
        self.callers.check_open(request)
        roles = self.roles_by_method.get(request.method or "")
        if roles is None:
            raise ApiError(
                405,
                "method_not_allowed",
                f"{request.method} is not allowed here",
                headers={"Allow": ", ".join(self.roles_by_method)},
            )
        self.callers.identify(request)
        if self.callers.names_a_person and not has_role(request.user, *roles):
            raise ApiError(403, "forbidden", "Your role does not allow this")


def door(callers: Callers, **roles_by_method: tuple[str, ...]) -> Callable[[Callable], Callable]:
    """The view behind one door: `callers` who may knock, and for each method it answers the roles
    needed (`NO_ROLE` for a caller that is no person)."""
    for method, roles in roles_by_method.items():
        if bool(roles) != callers.names_a_person:
            raise ImproperlyConfigured(f"{method}: a person needs a role; anyone else none")
    if callers.methods is not None and not set(roles_by_method) <= callers.methods:
        raise ImproperlyConfigured(f"{type(callers).__name__} may only {', '.join(sorted(callers.methods))}")
    the_door = Door(callers, roles_by_method)

    def decorator(view: Callable) -> Callable:
        @wraps(view)
        def behind_the_door(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            try:
                the_door.let_in(request)
                return view(request, *args, **kwargs)
            except ApiError as error:
                return error.response()
            except NotAllowed as refusal:
                return ApiError(409, "not_allowed", str(refusal)).response()
            except Http404:
                return not_found(request)
            except Exception:
                if not callers.answers_faults:
                    raise
                # A fault of ours, not of the request: the traceback goes to the log, never to the caller.
                log.exception("Unexpected error in %s %s", request.method, request.path)
                return server_error_response()

        guarded = csrf_exempt(behind_the_door)
        guarded.door = the_door
        return guarded

    return decorator
