"""Reviewers' holds on waiting drafts (SPEC §8): the desk takes one on the draft it shows, renews it
while the card is open, and a decision lets it go; a hold nobody renews runs out by itself. While one
is held, nobody else is shown that draft or may decide it (`approve_version`, `reject_version`)."""

from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from ..models import ReviewClaim
from .core import NotAllowed


def claim_draft(*, item_id: int, reviewer) -> bool:
    """Take the hold on an item's draft for BATCHDESK_CLAIM_SECONDS, or renew the reviewer's own, and
    let go of any other they hold (a desk shows one draft: the one moved on from is free for others).
    False, changing nothing, when another reviewer holds it. One statement takes it: two desks asking
    at once cannot both."""
    now = timezone.now()
    until = now + timedelta(seconds=settings.BATCHDESK_CLAIM_SECONDS)
    table = connection.ops.quote_name(ReviewClaim._meta.db_table)
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # A hold is a courtesy between desks, renewed every few seconds: one lost in a crash
            # costs nothing, so its commit does not wait for the disk.
            cursor.execute("SET LOCAL synchronous_commit TO OFF")
        cursor.execute(
            f"INSERT INTO {table} (item_id, reviewer_id, until) VALUES (%s, %s, %s) "
            "ON CONFLICT (item_id) DO UPDATE SET reviewer_id = excluded.reviewer_id, until = excluded.until "
            f"WHERE {table}.reviewer_id = excluded.reviewer_id OR {table}.until <= %s "
            "RETURNING item_id",
            [item_id, reviewer.pk, *map(connection.ops.adapt_datetimefield_value, (until, now))],
        )
        taken = cursor.fetchone() is not None
        if taken:
            ReviewClaim.objects.filter(reviewer=reviewer).exclude(item_id=item_id).delete()
    return taken


def holder_other_than(item_id: int, reviewer) -> ReviewClaim | None:
    """The hold someone else has on the item's draft now, if any."""
    return (
        ReviewClaim.objects.held()
        .filter(item_id=item_id)
        .exclude(reviewer=reviewer)
        .select_related("reviewer")
        .first()
    )


def check_not_held(item_id: int, reviewer) -> None:
    """Refuse a decision on a draft another reviewer is deciding on their desk."""
    if (claim := holder_other_than(item_id, reviewer)) is not None:
        raise NotAllowed(
            f"{claim.reviewer.get_username()} has this draft open on their desk; "
            "it is theirs to decide until they move on or leave it idle"
        )


def decided(item_id: int) -> None:
    """A decision on the draft ends every hold on it."""
    ReviewClaim.objects.filter(item_id=item_id).delete()
