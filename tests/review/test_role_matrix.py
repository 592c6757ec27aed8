"""Who may do what, for every address of the project (SPEC §8).

Every URL pattern is walked and requested by each role, by a user with no role and by an anonymous
visitor, with GET and with POST (an empty body). What each may get is declared in EXPECTED below: a new
address fails here until its roles are declared. The JSON API (`api/`) and `/metrics` have their own
tests; of the Django admin only its index is walked."""

import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import transaction
from django.urls import URLPattern, URLResolver, get_resolver

from ledger.models import CatalogueImport, Submission
from review.permissions import ADMIN, CATALOGUE_OWNER, OPERATOR
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

ANONYMOUS, NO_ROLE = "anonymous", "no role"
PRINCIPALS = (ANONYMOUS, NO_ROLE, CATALOGUE_OWNER, OPERATOR, ADMIN)
LOGIN = "302 to the login page"  # with ?next= naming the address asked for
ADMIN_LOGIN = "302 to the admin's login page"
METHODS = ("GET", "POST")


def for_roles(owner, operator, admin) -> dict:
    """A screen behind a login: anonymous visitors are sent to log in; people without a role are refused."""
    return {ANONYMOUS: LOGIN, NO_ROLE: 403, CATALOGUE_OWNER: owner, OPERATOR: operator, ADMIN: admin}


def viewers(status: int = 200) -> dict:
    return for_roles(status, status, status)


def approvers(status: int) -> dict:
    """Catalogue owners decide; operators see but may not."""
    return for_roles(status, 403, status)


def operators(status: int) -> dict:
    """Operators act; catalogue owners see but may not."""
    return for_roles(403, status, status)


def admins(status: int = 200) -> dict:
    return for_roles(403, 403, status)


def everyone(status) -> dict:
    return dict.fromkeys(PRINCIPALS, status)


def logged_in(status: int) -> dict:
    """Any logged-in person, with a role or not: their own account."""
    return {**everyone(status), ANONYMOUS: LOGIN}


NOT_ALLOWED = everyone(405)

# URL name → method → principal → status. A POST carries an empty body, so where the person may
# act the answer is "bad input" (400), or what the view does with nothing (a redirect, a form).
EXPECTED: dict[str, dict[str, dict]] = {
    # accounts: Django's own views
    "login": {"GET": everyone(200), "POST": everyone(200)},
    "logout": {"GET": NOT_ALLOWED, "POST": everyone(302)},
    "password_change": {"GET": logged_in(200), "POST": logged_in(200)},
    "password_change_done": {"GET": logged_in(200), "POST": logged_in(405)},
    # The company's sign-in: no login (it is one); off (404) while BATCHDESK_OIDC_ISSUER is unset, as
    # here (tests/review/test_company_sign_in.py runs it against a real provider).
    "company_sign_in": {"GET": everyone(404), "POST": NOT_ALLOWED},
    "company_sign_in_callback": {"GET": everyone(404), "POST": NOT_ALLOWED},
    # One's own screen preferences; an empty form names no time zone.
    "preferences": {"GET": logged_in(200), "POST": logged_in(400)},
    # Django's admin is for staff and the `admin` group; none of these people is staff.
    "admin:index": {
        "GET": {**everyone(ADMIN_LOGIN), ADMIN: 200},
        "POST": {**everyone(ADMIN_LOGIN), ADMIN: 200},
    },
    # screens
    "dashboard": {"GET": viewers(), "POST": NOT_ALLOWED},
    "job_list": {"GET": viewers(), "POST": NOT_ALLOWED},
    "job_start": {"GET": viewers(), "POST": approvers(400)},
    "job_estimate": {"GET": NOT_ALLOWED, "POST": approvers(200)},
    "job_detail": {"GET": viewers(), "POST": NOT_ALLOWED},
    # This job is no pilot: it has no report (a pilot's: tests/review/test_pilot_screens.py).
    "pilot_report": {"GET": viewers(404), "POST": NOT_ALLOWED},
    "pilot_decision": {"GET": NOT_ALLOWED, "POST": approvers(404)},
    # The blind comparison of a pilot's arms (tests/review/test_pilot_compare.py): every role sees it,
    # catalogue owners and admins answer.
    "pilot_compare": {"GET": viewers(404), "POST": NOT_ALLOWED},
    "pilot_compare_answer": {"GET": NOT_ALLOWED, "POST": approvers(404)},
    # A job's outcome as CSV (no format named): every role, as the job's page.
    "job_export": {"GET": viewers(), "POST": NOT_ALLOWED},
    # A job's receipts as CSV, for the finance team: every role, as the job's page.
    "job_receipts_csv": {"GET": viewers(), "POST": NOT_ALLOWED},
    # The providers' batch webhooks: no login, the signature is the authentication; off (404 to
    # everyone) while their secret is unset, as here (tests/review/test_provider_hooks.py signs).
    "openai_hook": {"GET": everyone(404), "POST": everyone(404)},
    "gemini_hook": {"GET": everyone(404), "POST": everyone(404)},
    # Operators cancel any job; a catalogue owner only their own (this one is someone else's).
    "job_cancel": {"GET": NOT_ALLOWED, "POST": operators(302)},
    # The job's owner, or an admin (the matrix's catalogue owner did not start the job).
    "job_budget": {"GET": NOT_ALLOWED, "POST": admins(302)},
    "job_resume": {"GET": NOT_ALLOWED, "POST": admins(302)},
    "item_detail": {"GET": viewers(), "POST": NOT_ALLOWED},
    "approve_item": {"GET": NOT_ALLOWED, "POST": approvers(400)},
    "reject_item": {"GET": NOT_ALLOWED, "POST": approvers(400)},
    # No decision of theirs to undo: said, and back to the item.
    "undo_item": {"GET": NOT_ALLOWED, "POST": approvers(302)},
    "keep_claim": {"GET": NOT_ALLOWED, "POST": approvers(204)},
    "comment_item": {"GET": NOT_ALLOWED, "POST": viewers(400)},
    "review_assignments": {"GET": viewers(), "POST": approvers(400)},
    "remove_assignment": {"GET": NOT_ALLOWED, "POST": approvers(400)},
    "regenerate_item": {"GET": NOT_ALLOWED, "POST": operators(400)},
    "review_queue": {"GET": viewers(), "POST": NOT_ALLOWED},
    "approve_selected": {"GET": NOT_ALLOWED, "POST": approvers(400)},
    "reject_selected": {"GET": NOT_ALLOWED, "POST": approvers(400)},
    "decide_matching": {"GET": NOT_ALLOWED, "POST": approvers(400)},
    "catalogue": {"GET": viewers(), "POST": NOT_ALLOWED},
    "catalogue_import": {"GET": viewers(), "POST": approvers(400)},
    "import_detail": {"GET": viewers(), "POST": NOT_ALLOWED},
    "import_history": {"GET": viewers(), "POST": NOT_ALLOWED},
    # The upload is not waiting for confirmation: nothing to do, back to its page.
    "import_confirm": {"GET": NOT_ALLOWED, "POST": approvers(302)},
    "import_discard": {"GET": NOT_ALLOWED, "POST": approvers(302)},
    "catalogue_product": {"GET": viewers(), "POST": NOT_ALLOWED},
    # One product edited (an empty form names no revision: the form again) or withdrawn (then back
    # to its page).
    "edit_product": {"GET": approvers(200), "POST": approvers(409)},
    "confirm_edit_product": {"GET": NOT_ALLOWED, "POST": approvers(400)},
    "withdraw_product": {"GET": approvers(200), "POST": approvers(302)},
    "prompts": {"GET": viewers(), "POST": NOT_ALLOWED},
    "prompt_new": {"GET": viewers(), "POST": approvers(400)},
    "prompt_detail": {"GET": viewers(), "POST": NOT_ALLOWED},
    # The version is current already: nothing to change, back to its page.
    "prompt_make_current": {"GET": NOT_ALLOWED, "POST": approvers(302)},
    "operations": {"GET": viewers(), "POST": NOT_ALLOWED},
    "operations_retry": {"GET": NOT_ALLOWED, "POST": operators(400)},
    "operations_retry_group": {"GET": NOT_ALLOWED, "POST": operators(400)},
    "resolve_submission": {"GET": NOT_ALLOWED, "POST": operators(302)},
    "resend_submission": {"GET": NOT_ALLOWED, "POST": operators(302)},
    # Draft quality: every role sees it, and its CSV.
    "quality": {"GET": viewers(), "POST": NOT_ALLOWED},
    "quality_csv": {"GET": viewers(), "POST": NOT_ALLOWED},
    "audit": {"GET": admins(), "POST": NOT_ALLOWED},
    "audit_csv": {"GET": admins(), "POST": NOT_ALLOWED},
    "audit_events": {"GET": admins(), "POST": NOT_ALLOWED},
}


# --- every address -------------------------------------------------------------------------


def walk(patterns, prefix: str = "", namespace: str = "") -> Iterator[tuple[str, str]]:
    """(route, name) of every pattern, with namespaced names; unnamed patterns go by their route."""
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            inner = f"{namespace}{pattern.namespace}:" if pattern.namespace else namespace
            yield from walk(pattern.url_patterns, route, inner)
        elif isinstance(pattern, URLPattern):
            yield route, f"{namespace}{pattern.name}" if pattern.name else route


def walked(route: str) -> bool:
    if route.startswith("admin/"):
        return route == "admin/"  # the index; the rest is Django's admin
    return not route.startswith(("api/", "metrics"))


ADDRESSES = [(route, name) for route, name in walk(get_resolver().url_patterns) if walked(route)]


def test_the_table_declares_every_address_and_only_those():
    names = {name for _, name in ADDRESSES}
    unknown = sorted(names - EXPECTED.keys())
    stale = sorted(EXPECTED.keys() - names)
    assert not unknown, f"Declare in EXPECTED who may use these new addresses: {unknown}"
    assert not stale, f"These addresses are gone; remove them from EXPECTED: {stale}"
    assert len(names) == len(ADDRESSES), "two patterns share a name"


# --- one request per person and method -----------------------------------------------------


@pytest.fixture
def people(owner, operator, outsider) -> dict:
    return {
        ANONYMOUS: None,
        NO_ROLE: outsider,
        CATALOGUE_OWNER: owner,
        OPERATOR: operator,
        ADMIN: UserFactory(roles=[ADMIN]),
    }


@pytest.fixture
def parameters(item, draft) -> dict:
    """A real object for every kind of parameter an address may take."""
    submission = Submission.objects.create(
        job=item.job, provider="emulator", model="m", intent_key="bd_matrix"
    )
    upload = CatalogueImport.objects.create(file_name="a.csv", size=1, uploaded_by=item.job.owner)
    return {
        "import_id": upload.pk,
        "job_id": item.job_id,
        "item_id": item.pk,
        "version_id": draft.pk,
        "submission_id": submission.pk,
        "sku": item.product.sku,
        "prompt_id": item.job.prompt_version_id,
        # No comparison has this number (and the job is no pilot): 404 to whoever may answer.
        "comparison_id": 1,
    }


def address(route: str, parameters: dict) -> str:
    def value(match: re.Match) -> str:
        name = match.group("name")
        assert name in parameters, f"/{route}: add a real value for <{name}> to the parameters fixture"
        return str(parameters[name])

    assert not route.startswith("^"), f"{route}: a regular-expression route; give it a path() route"
    return "/" + re.sub(r"<(?:[^>:]+:)?(?P<name>[^>]+)>", value, route)


@contextmanager
def undone():
    """Each request sees the same world: whatever it changes is rolled back."""
    with transaction.atomic():
        yield
        transaction.set_rollback(True)


def outcome(response, url: str) -> int | str:
    if response.status_code == 302:
        if response.url.startswith(f"/accounts/login/?next={url}"):
            return LOGIN
        if response.url.startswith(f"/admin/login/?next={url}"):
            return ADMIN_LOGIN
    return response.status_code


@pytest.mark.parametrize("route, name", ADDRESSES, ids=[route or "/" for route, _ in ADDRESSES])
def test_each_address_answers_each_person_as_declared(client, people, parameters, route, name):
    assert name in EXPECTED, f"/{route} ({name}) is not in EXPECTED: declare who may use it"
    url = address(route, parameters)
    got, want = {}, {}
    for method in METHODS:
        for principal, user in people.items():
            client.logout()
            if user is not None:
                client.force_login(user)
            with undone():
                response = client.get(url) if method == "GET" else client.post(url, {})
            got[method, principal] = outcome(response, url)
            want[method, principal] = EXPECTED[name][method][principal]
    mismatches = {key: f"got {got[key]}, expected {want[key]}" for key in got if got[key] != want[key]}
    assert not mismatches, f"{url}: {mismatches}"
