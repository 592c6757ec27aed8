"""Parts that add up to their whole exactly (SPEC §9: "rows add up to their totals"): a total split in
proportion to weights, each part rounded to the ledger's places, the pennies rounding leaves over given
to the parts that lost most to it (the largest-remainder method), so no row's rounding can make a
column disagree with its total."""

from decimal import ROUND_FLOOR, Decimal

from .currency import PLACES


def split_exactly(total: Decimal, weights: list[Decimal], places: Decimal = PLACES) -> list[Decimal]:
    """`total` in parts proportional to `weights` (none negative), each a multiple of `places`, adding up
    to `total` exactly (which must itself be a multiple of `places`). All weights zero: equal parts."""
    if not weights:
        return []
    total = Decimal(total)
    if total != total.quantize(places):
        raise ValueError(f"{total} is not a whole number of {places}")
    whole = sum(weights, Decimal(0))
    if whole <= 0:
        weights, whole = [Decimal(1)] * len(weights), Decimal(len(weights))
    exact = [total * weight / whole for weight in weights]
    parts = [share.quantize(places, rounding=ROUND_FLOOR) for share in exact]
    left = int((total - sum(parts, Decimal(0))) / places)
    by_remainder = sorted(range(len(parts)), key=lambda i: (exact[i] - parts[i], -i), reverse=True)
    for i in by_remainder[:left]:
        parts[i] += places
    return parts
