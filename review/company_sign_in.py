"""Company sign-in (SPEC §8): the company's OpenID Connect provider (Okta, Entra ID, Keycloak…)
through mozilla-django-oidc, the authorization code flow with PKCE.

- The issuer's endpoints come from its `/.well-known/openid-configuration`, fetched at the first
  sign-in and kept for the life of the process (a failed fetch is tried again at the next one):
  startup and `migrate` never reach the issuer, and an issuer that cannot be reached makes the
  "Sign in with…" button answer with a message on the log-in page, never a 500.
- A person is their issuer's `sub` (`CompanyIdentity`): created at the first sign-in under the
  user name the provider prefers (`preferred_username`, else `email`, else `sub`), the same account
  however the directory renames them later. The user name stays as first given (it is what the audit
  shows); the e-mail address and names follow the directory at each sign-in.
- Roles follow the groups claim (BATCHDESK_OIDC_GROUPS_CLAIM) at every sign-in, through
  BATCHDESK_OIDC_ROLE_GROUPS: a role whose groups the person no longer has is taken away; groups
  that are not roles are left alone; a person with no mapped group has no role. A company sign-in
  lasts SESSION_HOURS, so every role is read from the directory again at least that often.
"""

import json
import logging
from dataclasses import dataclass

import httpx
import requests
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group
from django.core import checks
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.http import Http404, HttpResponseRedirect
from django.urls import reverse
from django.utils.http import urlencode
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from ledger.roles import ROLES

from .models import CompanyIdentity

logger = logging.getLogger(__name__)

DISCOVERY_PATH = "/.well-known/openid-configuration"
# How long a company sign-in lasts: a working day, then the provider is asked again (without a form
# while the person's session there lasts), so roles and leavers follow the directory within it.
SESSION_HOURS = 12
DISCOVERY_TIMEOUT_SECONDS = 10


def configured() -> bool:
    return bool(settings.BATCHDESK_OIDC_ISSUER)


def company_name() -> str:
    return settings.BATCHDESK_OIDC_NAME


# --- the issuer --------------------------------------------------------------------------------


class IssuerUnreachable(Exception):
    """The issuer's discovery document could not be read, or does not describe that issuer."""


@dataclass(frozen=True)
class Issuer:
    """What the sign-in needs from the issuer's discovery document."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    userinfo_endpoint: str | None


_discovered: dict[str, Issuer] = {}


def issuer() -> Issuer:
    """The configured issuer, discovered once per process (raises IssuerUnreachable)."""
    url = settings.BATCHDESK_OIDC_ISSUER
    found = _discovered.get(url)
    if found is None:
        found = _discovered[url] = discover(url)
    return found


def discover(url: str) -> Issuer:
    """Reads `url`'s discovery document; its `issuer` must be `url` (OpenID Connect Discovery §4.3),
    so that a document served elsewhere cannot name someone else's endpoints."""
    address = url.rstrip("/") + DISCOVERY_PATH
    try:
        response = httpx.get(address, timeout=DISCOVERY_TIMEOUT_SECONDS)
        response.raise_for_status()
        document = response.json()
    except (httpx.HTTPError, ValueError) as error:
        raise IssuerUnreachable(f"{address} could not be read: {error}") from error
    if not isinstance(document, dict):
        raise IssuerUnreachable(f"{address} is not a discovery document")
    if str(document.get("issuer", "")).rstrip("/") != url.rstrip("/"):
        raise IssuerUnreachable(f"{address} names the issuer {document.get('issuer')!r}, not {url!r}")
    missing = [
        key
        for key in ("authorization_endpoint", "token_endpoint", "jwks_uri")
        if not isinstance(document.get(key), str)
    ]
    if missing:
        raise IssuerUnreachable(f"{address} names no {', '.join(missing)}")
    return Issuer(
        issuer=document["issuer"],
        authorization_endpoint=document["authorization_endpoint"],
        token_endpoint=document["token_endpoint"],
        jwks_uri=document["jwks_uri"],
        userinfo_endpoint=document.get("userinfo_endpoint") or None,
    )


# --- roles from groups ------------------------------------------------------------------------


def role_groups() -> dict[str, list[str]]:
    """BATCHDESK_OIDC_ROLE_GROUPS, read (system check batchdesk.E020 refuses a bad one at startup)."""
    return json.loads(settings.BATCHDESK_OIDC_ROLE_GROUPS)


def directory_groups(claims: dict) -> set[str]:
    """The groups the claim names: a list of names (or ids), or one name alone."""
    value = claims.get(settings.BATCHDESK_OIDC_GROUPS_CLAIM)
    if isinstance(value, str):
        return {value}
    if isinstance(value, list):
        return {group for group in value if isinstance(group, str)}
    return set()


def roles_from(claims: dict) -> set[str]:
    groups = directory_groups(claims)
    return {role for role, needed in role_groups().items() if groups.intersection(needed)}


# --- the person -------------------------------------------------------------------------------


def signed_in_person(*, issuer_url: str, claims: dict):
    """The account of the person the provider vouched for (`claims` verified), created at their first
    sign-in, with their roles set from their groups as the directory has them now; None for an
    account an admin deactivated (the directory does not undo that)."""
    User = get_user_model()
    subject = claims["sub"]
    with transaction.atomic():
        identity = (
            CompanyIdentity.objects.select_for_update()
            .select_related("user")
            .filter(issuer=issuer_url, subject=subject)
            .first()
        )
        if identity is None:
            # No password: this account signs in through the company only.
            person = User.objects.create_user(free_username(claims), email=claims.get("email") or "")
            identity = CompanyIdentity.objects.create(user=person, issuer=issuer_url, subject=subject)
        person = identity.user
        if not person.is_active:
            logger.warning("%s signed in through the company, but an admin deactivated the account", person)
            return None
        person.email = claims.get("email") or person.email
        person.first_name = str(claims.get("given_name") or person.first_name)[:150]
        person.last_name = str(claims.get("family_name") or person.last_name)[:150]
        person.save(update_fields=["email", "first_name", "last_name"])
        roles = roles_from(claims)
        person.groups.remove(*Group.objects.filter(name__in=set(ROLES) - roles))
        person.groups.add(*Group.objects.filter(name__in=roles))
    logger.info("%s signed in through the company, roles: %s", person.username, sorted(roles) or "none")
    return person


def free_username(claims: dict) -> str:
    """The name the provider prefers, made unique with a number when a local account has it."""
    User = get_user_model()
    wanted = str(claims.get("preferred_username") or claims.get("email") or claims["sub"])[:140]
    name, n = wanted, 1
    while User.objects.filter(username__iexact=name).exists():
        n += 1
        name = f"{wanted}-{n}"
    return name


class CompanySignInBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend, told the issuer's endpoints at each sign-in (not when made: a
    backend is made whenever a session is read), matching people by `sub`, with roles from groups."""

    def __init__(self, *args, **kwargs):
        self.UserModel = get_user_model()

    def authenticate(self, request, **kwargs):
        # Only the callback passes a PKCE verifier: a password log-in never reaches the provider.
        if request is None or "code_verifier" not in kwargs or not configured():
            return None
        self.issuer = issuer()
        self.OIDC_OP_TOKEN_ENDPOINT = self.issuer.token_endpoint
        self.OIDC_OP_USER_ENDPOINT = self.issuer.userinfo_endpoint
        self.OIDC_OP_JWKS_ENDPOINT = self.issuer.jwks_uri
        self.OIDC_RP_CLIENT_ID = settings.BATCHDESK_OIDC_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.BATCHDESK_OIDC_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO = settings.OIDC_RP_SIGN_ALGO
        self.OIDC_RP_IDP_SIGN_KEY = None
        return super().authenticate(request, **kwargs)

    def verify_token(self, token, **kwargs):
        """The library checks the signature and the nonce; the token must also be this issuer's, for
        this client."""
        payload = super().verify_token(token, **kwargs)
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if str(payload.get("iss", "")).rstrip("/") != self.issuer.issuer.rstrip("/"):
            raise SuspiciousOperation("The ID token is not the configured issuer's")
        if settings.BATCHDESK_OIDC_CLIENT_ID not in audiences:
            raise SuspiciousOperation("The ID token is not meant for this client")
        return payload

    def get_or_create_user(self, access_token, id_token, payload):
        """The claims are the ID token's (signed, and where Entra ID puts groups and roles) with the
        user info endpoint's added, which must be about the same `sub`."""
        claims = {}
        if self.OIDC_OP_USER_ENDPOINT:
            claims = self.get_userinfo(access_token, id_token, payload)
            if claims.get("sub") != payload.get("sub"):
                raise SuspiciousOperation("The user info is about someone else than the ID token")
        claims.update(payload)
        if not claims.get("sub"):
            raise SuspiciousOperation("The ID token names no subject")
        return signed_in_person(issuer_url=self.issuer.issuer, claims=claims)

    def get_user(self, user_id):
        # Django's own: an account an admin deactivated is signed out at its next request (the
        # library's would keep its sessions going).
        return ModelBackend.get_user(self, user_id)


# --- the two addresses ------------------------------------------------------------------------


def back_to_log_in(request, text: str, next_url: str | None) -> HttpResponseRedirect:
    """The log-in page with `text` on it, still on the way to `next_url` (checked again there)."""
    messages.error(request, text)
    address = reverse("login")
    if next_url:
        address += "?" + urlencode({"next": next_url})
    return HttpResponseRedirect(address)


def unreachable(request, error: Exception, next_url: str | None) -> HttpResponseRedirect:
    logger.warning("Company sign-in: the issuer cannot be reached: %s", error)
    return back_to_log_in(
        request,
        f"Signing in with {company_name()} is not possible just now: its sign-in service "
        "(the OpenID provider) cannot be reached. Try again in a minute; if it goes on, tell an admin.",
        next_url,
    )


class StartSignIn(OIDCAuthenticationRequestView):
    """`/oidc/authenticate/`: off to the provider, with state, nonce and a PKCE code challenge."""

    def __init__(self, *args, **kwargs):
        # The library reads the provider's address here; it is discovered in `get` instead.
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)

    def get(self, request):
        if not configured():
            raise Http404("Company sign-in is not configured")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = issuer().authorization_endpoint
        except IssuerUnreachable as error:
            return unreachable(request, error, request.GET.get("next"))
        self.OIDC_RP_CLIENT_ID = settings.BATCHDESK_OIDC_CLIENT_ID
        return super().get(request)


class FinishSignIn(OIDCAuthenticationCallbackView):
    """`/oidc/callback/`: the provider's answer, turned into a signed-in person or a message."""

    def get(self, request):
        if not configured():
            raise Http404("Company sign-in is not configured")
        try:
            return super().get(request)
        except IssuerUnreachable as error:
            return unreachable(request, error, request.session.get("oidc_login_next"))
        except requests.RequestException as error:
            # The token or user info endpoint failed; its words are the provider's, never the secret.
            logger.warning("Company sign-in: the provider refused or failed: %s", error)
            return self.login_failure()
        except SuspiciousOperation as error:
            # A stale or replayed answer (state not in this session), or a token that does not verify.
            logger.warning("Company sign-in: an answer that does not check out: %s", error)
            return self.login_failure()

    def login_success(self):
        response = super().login_success()
        self.request.session.set_expiry(SESSION_HOURS * 3600)
        return response

    def login_failure(self):
        return back_to_log_in(
            self.request,
            f"Signing in with {company_name()} did not complete, and nothing changed here. "
            "Start again with the button below; if it keeps failing, tell an admin.",
            self.request.session.get("oidc_login_next"),
        )


# --- system checks ----------------------------------------------------------------------------


def check_company_sign_in(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """Settings that would fail every sign-in stop every process at startup (the issuer itself is
    not reached here)."""
    errors = []
    try:
        mapping = json.loads(settings.BATCHDESK_OIDC_ROLE_GROUPS)
    except ValueError as error:
        mapping, problem = None, f"is not JSON ({error})"
    else:
        problem = None
        if not isinstance(mapping, dict) or not all(
            isinstance(groups, list) and all(isinstance(group, str) for group in groups)
            for groups in mapping.values()
        ):
            problem = 'must be a JSON object of role -> list of group names, e.g. {"admin": ["IT admins"]}'
        elif unknown := sorted(set(mapping) - set(ROLES)):
            problem = f"names roles that do not exist: {', '.join(unknown)} (the roles: {', '.join(ROLES)})"
    if problem:
        errors.append(checks.Error(f"BATCHDESK_OIDC_ROLE_GROUPS {problem}", id="batchdesk.E020"))
    if not settings.BATCHDESK_LOCAL_LOGIN and not configured():
        errors.append(
            checks.Warning(
                "BATCHDESK_LOCAL_LOGIN=0 without BATCHDESK_OIDC_ISSUER: only superusers can sign in",
                hint="Set the company sign-in (BATCHDESK_OIDC_*), or leave local passwords on.",
                id="batchdesk.W021",
            )
        )
    if configured():
        missing = [
            name
            for name in ("BATCHDESK_OIDC_CLIENT_ID", "BATCHDESK_OIDC_CLIENT_SECRET")
            if not getattr(settings, name)
        ]
        if missing:
            errors.append(
                checks.Error(
                    f"BATCHDESK_OIDC_ISSUER is set, {' and '.join(missing)} not",
                    hint="Set the client id and secret the provider gave BatchDesk's registration.",
                    id="batchdesk.E020",
                )
            )
        if not settings.BATCHDESK_OIDC_ISSUER.startswith(("https://", "http://")):
            errors.append(
                checks.Error(
                    f"BATCHDESK_OIDC_ISSUER {settings.BATCHDESK_OIDC_ISSUER!r} is not an https:// address",
                    id="batchdesk.E020",
                )
            )
    return errors


def check_issuer_over_tls(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """`check --deploy`: outside DEBUG, sign-in through an issuer over plain http lets anyone on the
    way read the codes and tokens, and swap the keys the tokens are checked with."""
    if settings.DEBUG or not settings.BATCHDESK_OIDC_ISSUER.startswith("http://"):
        return []
    return [
        checks.Warning(
            f"BATCHDESK_OIDC_ISSUER {settings.BATCHDESK_OIDC_ISSUER} is plain http",
            hint="Use the provider's https:// issuer address.",
            id="batchdesk.W020",
        )
    ]
