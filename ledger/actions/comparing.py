"""A reviewer's blind comparison of two arms' drafts of one product (SPEC §8; issue 30 point 5).

`show_next_pair` hands the reviewer the pair they were shown and have not answered yet, or else the
next product two arms have comparable drafts of (`ledger.pilots.comparison`) that the reviewer has not
compared: it writes the comparison with its sides drawn at random, so that the page need not say, and
the answer can be mapped back to the arms. `record_preference` records the answer once: the same form
sent again (a double click, Back, a refresh) finds it answered and changes nothing (rule 15)."""

import secrets

from django.db import transaction
from django.utils import timezone

from ..models import ArmPreference, Pilot, Product
from ..pilots.comparison import arm_pairs, comparable_drafts, side_to_preference
from .core import NotAllowed

SIDES = ("left", "right", "both", "neither")


class AlreadyCompared(NotAllowed):
    """The reviewer answered this comparison before."""


def show_next_pair(*, first: Pilot, reviewer) -> ArmPreference | None:
    """The comparison to show the reviewer now (module docstring), or None when none is left."""
    waiting = (
        ArmPreference.objects.filter(pilot=first, reviewer=reviewer, preference="")
        .order_by("shown_at", "pk")
        .first()
    )
    if waiting is not None:
        return waiting
    for arm_a, arm_b in arm_pairs(first):
        drafts_a, drafts_b = comparable_drafts(arm_a), comparable_drafts(arm_b)
        done = set(
            ArmPreference.objects.filter(
                pilot=first, reviewer=reviewer, arm_a=arm_a.arm, arm_b=arm_b.arm
            ).values_list("product_id", flat=True)
        )
        both = set(drafts_a) & set(drafts_b) - done
        if not both:
            continue
        product_id = _first_by_sku(both)
        shown, _ = ArmPreference.objects.get_or_create(
            pilot=first,
            arm_a=arm_a.arm,
            arm_b=arm_b.arm,
            reviewer=reviewer,
            product_id=product_id,
            defaults={
                "version_a_id": drafts_a[product_id],
                "version_b_id": drafts_b[product_id],
                "a_on_left": secrets.randbelow(2) == 0,
            },
        )
        return shown
    return None


def _first_by_sku(product_ids: set[int]) -> int:
    return Product.objects.filter(pk__in=product_ids).order_by("sku").values_list("pk", flat=True).first()


def record_preference(*, first: Pilot, comparison_id: int, reviewer, side: str) -> ArmPreference:
    """Record which side the reviewer preferred (`left`, `right`, `both`, `neither`). Raises
    ArmPreference.DoesNotExist for a comparison not shown to this reviewer in this pilot,
    AlreadyCompared when it was answered before, and NotAllowed for a side that is none of those."""
    if side not in SIDES:
        raise NotAllowed(f"say left, right, both or neither, not {side!r}")
    with transaction.atomic():
        comparison = ArmPreference.objects.get(pk=comparison_id, pilot=first, reviewer=reviewer)
        changed = ArmPreference.objects.filter(pk=comparison.pk, preference="").update(
            preference=side_to_preference(comparison, side), decided_at=timezone.now()
        )
    if not changed:
        raise AlreadyCompared("This pair is compared already: nothing more was recorded")
    comparison.refresh_from_db()
    return comparison
