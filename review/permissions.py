"""Who may do what on the screens and through the API (SPEC §8). The roles themselves, and who holds
one, are `ledger.roles`."""

from collections.abc import Callable
from functools import wraps

from django.core.exceptions import PermissionDenied

from ledger.roles import ADMIN, CATALOGUE_OWNER, OPERATOR, has_role

# The screens and the API read roles and the role check from here, beside who may do what.
__all__ = [
    "ADMIN",
    "APPROVERS",
    "CATALOGUE_OWNER",
    "OPERATOR",
    "OPERATORS",
    "VIEWERS",
    "has_role",
    "may_cancel",
    "may_see_recipients",
    "may_spend",
    "role_required",
]

# Everything is visible to every role; approving is a catalogue owner's decision, never an operator's.
VIEWERS = (CATALOGUE_OWNER, OPERATOR, ADMIN)
APPROVERS = (CATALOGUE_OWNER, ADMIN)
# Retrying failed work is an operator's (and, as everything, an admin's).
OPERATORS = (OPERATOR,)


def may_cancel(user, job) -> bool:
    """Operators may cancel any job; the person who started a job may cancel it too."""
    return has_role(user, OPERATOR) or (job.owner_id == user.pk and has_role(user, *APPROVERS))


def may_spend(user, job) -> bool:
    """Who may give a job more money or let a paused job go on: its owner, or an admin."""
    return has_role(user, ADMIN) or (job.owner_id == user.pk and has_role(user, *APPROVERS))


def may_see_recipients(user, job) -> bool:
    """Who reads where a job's events go in full (its notify_url, whose path may carry the receiver's
    token, and its owner's e-mail address) and what its receivers answered: its owner, or an admin;
    other roles see the host and each attempt's status only."""
    return has_role(user, ADMIN) or job.owner_id == user.pk


def role_required(*groups: str) -> Callable:
    """403 unless the (logged-in) user is in one of `groups`. Put `login_required` outside it."""

    def decorator(view: Callable) -> Callable:
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            if not has_role(request.user, *groups):
                raise PermissionDenied
            return view(request, *args, **kwargs)

        return wrapped

    return decorator
