"""The blind comparison of a pilot's arms (SPEC §8; issue 30 point 5): which drafts may be compared,
what reviewers preferred, and how sure the arms report can be (`ledger.pilots.intervals`).

Two arms' drafts of one product can be compared when the pilot gave every arm the same sample
(`Pilot.same_sample`) and each arm has a valid draft of the product waiting for review or decided
(approved, being applied, applied, refused by the destination, or rejected): the latest valid version
of the arm's latest such item for the product. Pairs of arms are taken in order (1 and 2, 1 and 3, …,
2 and 3, …), products in SKU order.

An arm's preference share: of the comparisons it was in, those in which its draft was preferred,
alone or as one of "both"; "neither" counts as not preferred. Between two arms, "both" and "neither"
are ties and the sign test leaves them out (`intervals.Preferences`)."""

from collections import Counter
from itertools import combinations

from ..models import ArmPreference, GeneratedVersion, Pilot, Preference
from ..states import ItemState
from .intervals import Preferences, difference, more_decisions_for_acceptance, share

COMPARABLE_STATES = (
    ItemState.AWAITING_REVIEW,
    ItemState.APPROVED,
    ItemState.APPLYING,
    ItemState.APPLIED,
    ItemState.DESTINATION_REJECTED,
    ItemState.REJECTED,
)


def first_arm(pilot: Pilot) -> Pilot:
    """The pilot's group is named by its first arm (the pilot itself, for the first arm)."""
    return pilot.first_arm if pilot.first_arm_id else pilot


def arms_in(first: Pilot) -> list[Pilot]:
    return [first, *first.other_arms.select_related("job").order_by("arm")]


def arm_pairs(first: Pilot) -> list[tuple[Pilot, Pilot]]:
    return list(combinations(arms_in(first), 2))


def comparable_drafts(arm: Pilot) -> dict[int, int]:
    """{product id: version id} of the arm's drafts that may be compared (module docstring)."""
    rows = (
        GeneratedVersion.objects.filter(
            item__job_id=arm.job_id, item__state__in=COMPARABLE_STATES, valid=True
        )
        .order_by("item__product_id", "-item_id", "-number")
        .values_list("item__product_id", "pk")
    )
    drafts: dict[int, int] = {}
    for product_id, version_id in rows:
        drafts.setdefault(product_id, version_id)
    return drafts


def side_to_preference(preference: ArmPreference, side: str) -> str:
    """`left`, `right`, `both` or `neither`, as the reviewer saw it, in the arms' terms."""
    if side in (Preference.BOTH, Preference.NEITHER):
        return side
    left_is_a = preference.a_on_left
    return Preference.A if (side == "left") == left_is_a else Preference.B


def preferences_between(first: Pilot) -> dict[tuple[int, int], Preferences]:
    """{(arm a, arm b): what the decided comparisons of that pair preferred}."""
    counts = Counter(
        ArmPreference.objects.filter(pilot=first)
        .exclude(preference="")
        .values_list("arm_a", "arm_b", "preference")
    )
    tallies = {}
    for a, b in combinations(sorted(arm.arm for arm in arms_in(first)), 2):
        tallies[(a, b)] = Preferences(
            a=counts[(a, b, Preference.A)],
            b=counts[(a, b, Preference.B)],
            both=counts[(a, b, Preference.BOTH)],
            neither=counts[(a, b, Preference.NEITHER)],
        )
    return tallies


def interval_json(successes: int, trials: int) -> dict | None:
    """A share with its 95 % interval, rounded to four places, or None without trials."""
    found = share(successes, trials)
    if found is None:
        return None
    return {
        "rate": _round(found.expected),
        "low": _round(found.low),
        "high": _round(found.high),
        "successes": successes,
        "trials": trials,
    }


def _round(value) -> float:
    return round(float(value), 4)


def arm_preference_json(arm: int, tallies: dict[tuple[int, int], Preferences]) -> dict | None:
    """How often the arm's draft was preferred (alone or as one of both) in the comparisons it was in."""
    preferred = comparisons = 0
    for (a, b), seen in tallies.items():
        if arm == a:
            preferred += seen.a + seen.both
        elif arm == b:
            preferred += seen.b + seen.both
        else:
            continue
        comparisons += seen.comparisons
    return interval_json(preferred, comparisons)


def pair_json(first_row: dict, second_row: dict, seen: Preferences) -> dict:
    """Two arms side by side: the difference of their acceptance, and their preferences, each with
    whether it is told apart from chance and, if not, how many more decisions would settle it."""
    one = (first_row["approvals"], first_row["decisions"])
    two = (second_row["approvals"], second_row["decisions"])
    apart = difference(one, two)
    won = seen.a_share_of_decisive()
    return {
        "arms": [first_row["arm"], second_row["arm"]],
        "acceptance": {
            "difference": _round(apart.expected) if apart else None,
            "low": _round(apart.low) if apart else None,
            "high": _round(apart.high) if apart else None,
            "distinguishable": apart.settled if apart else False,
            "more_decisions_needed": more_decisions_for_acceptance(one, two),
        },
        "preference": {
            "comparisons": seen.comparisons,
            "a": seen.a,
            "b": seen.b,
            "both": seen.both,
            "neither": seen.neither,
            "a_share_of_one_preferred": (
                {"rate": _round(won.expected), "low": _round(won.low), "high": _round(won.high)}
                if won
                else None
            ),
            "distinguishable": seen.settled(),
            "more_comparisons_needed": seen.more_needed(),
        },
    }


def pairs_json(tallies: dict[tuple[int, int], Preferences], rows: list[dict]) -> list[dict]:
    """Every pair of arms of the report's rows (`Report.arms_compared`)."""
    by_arm = {row["arm"]: row for row in rows}
    return [pair_json(by_arm[a], by_arm[b], seen) for (a, b), seen in tallies.items()]
