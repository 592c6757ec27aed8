"""Who may do what on the screens (SPEC §8). Roles are Django groups that every migrate puts in place (ledger.bootstrap)."""

from collections.abc import Callable
from functools import wraps

from django.core.exceptions import PermissionDenied

from ledger.bootstrap import ROLES

CATALOGUE_OWNER, OPERATOR, ADMIN = ROLES

# Everything is visible to every role; approving is a catalogue owner's decision, never an operator's.
VIEWERS = (CATALOGUE_OWNER, OPERATOR, ADMIN)
APPROVERS = (CATALOGUE_OWNER, ADMIN)


def roles_of(user) -> frozenset[str]:
    """The user's group names, read once per request."""
    if not user.is_authenticated:
        return frozenset()
    cached = getattr(user, "_batchdesk_roles", None)
    if cached is None:
        cached = frozenset(user.groups.values_list("name", flat=True))
        user._batchdesk_roles = cached
    return cached


def has_role(user, *groups: str) -> bool:
    """Superusers and the `admin` group pass everything."""
    if not user.is_authenticated:
        return False
    if user.is_superuser:
        return True
    roles = roles_of(user)
    return ADMIN in roles or not roles.isdisjoint(groups)


def may_cancel(user, job) -> bool:
    """Operators may cancel any job; the person who started a job may cancel it too."""
    return has_role(user, OPERATOR) or (job.owner_id == user.pk and has_role(user, *APPROVERS))


def may_spend(user, job) -> bool:
    """Who may give a job more money or let a paused job go on: its owner, or an admin."""
    return has_role(user, ADMIN) or (job.owner_id == user.pk and has_role(user, *APPROVERS))


def may_see_recipients(user, job) -> bool:
    """Who reads where a job's events go in full (its notify_url, whose path may carry the receiver's
    token, and its owner's e-mail address): its owner, or an admin; other roles see the host only."""
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
