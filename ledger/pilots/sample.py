"""A pilot's sample (SPEC §1 "pilot"; §6 `POST /api/jobs` with `pilot`): the scope split into strata
by product fields, and `per_stratum` products drawn from each with the seed.

Drawn by the database, as a job's items are written: however large the scope, no product passes
through Python. Within its stratum each product is ranked by md5 of the seed and its SKU, and the first
`per_stratum` are drawn: the same seed over the same scope draws the same sample, another seed another
one, and a stratum smaller than `per_stratum` gives all its products.

A product's stratum is its current revision's values of the named fields, as text; a product without
the field (or with null) is in that field's `(none)` stratum. `source_length` is not a field: it is
the length band of the source text (the title and the fields as JSON text, in characters): the
shortest third of the scope is `short`, the next `medium`, the longest `long`.
"""

from dataclasses import dataclass

from django.db import connection
from django.db.models import QuerySet, TextField
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Length

from ..models import Job, Pilot, PilotProduct, PilotStratum, Product

SOURCE_LENGTH = "source_length"
LENGTH_BANDS = ("short", "medium", "long")
# Strata when a pilot names none: the category, where the catalogue has one, and the length band.
DEFAULT_STRATA = ("category", SOURCE_LENGTH)
MAX_PER_STRATUM = 1_000
MAX_STRATA_FIELDS = 3
# A pilot is a sample its reviewers read through: more strata or products than this is not one.
MAX_STRATA = 500
MAX_SAMPLE = 5_000


@dataclass(frozen=True)
class PilotPlan:
    """What a pilot asks for: `per_stratum` products from each stratum of `strata`, drawn with `seed`."""

    per_stratum: int
    strata: tuple[str, ...]
    seed: int
    drill: bool = False
    # This pilot is arm `arm` of `arms` drawing the same sample: it takes the draws whose place in
    # their stratum's random order falls to it (1st, then every `arms`-th), so each arm gets a share
    # of every stratum (stratified randomisation) and no product is in two arms. With `same_sample`,
    # every arm takes every draw: each product is drafted by each arm, a paired design, which the
    # blind comparison of two arms' drafts of one product needs.
    arm: int = 1
    arms: int = 1
    same_sample: bool = False

    @property
    def share(self) -> tuple[int, int]:
        """(every how many draws this arm takes one, which of them: 0 for the 1st)."""
        return (1, 0) if self.same_sample else (self.arms, self.arm - 1)

    def arm_share(self, drawn: int) -> int:
        """How many of a stratum's `drawn` products fall to this arm."""
        every, which = self.share
        return len(range(which, drawn, every))


@dataclass(frozen=True)
class Stratum:
    number: int
    values: dict[str, str | None]
    scope_products: int
    sample_products: int


class SampleRefused(ValueError):
    """The sample asked for cannot be drawn (too many strata or products); nothing was written."""


def unknown_fields(strata: tuple[str, ...], scope: QuerySet[Product]) -> list[str]:
    """The named fields no product of the scope has (`source_length` is always known)."""
    return [
        name
        for name in strata
        if name != SOURCE_LENGTH and not scope.filter(current_revision__fields__has_key=name).exists()
    ]


def default_strata(scope: QuerySet[Product]) -> tuple[str, ...]:
    """`DEFAULT_STRATA` without a field the scope's products lack."""
    missing = unknown_fields(DEFAULT_STRATA, scope)
    return tuple(name for name in DEFAULT_STRATA if name not in missing)


def _ranked(plan: PilotPlan, scope: QuerySet[Product]) -> tuple[str, list]:
    """SQL of the scope's products, one row each: `id`, its stratum's keys `k0`, `k1`… (a field's text,
    or the length band's 1, 2, 3), the `stratum`'s number (1, 2… in the keys' order) and the product's
    `draw` within its stratum (1: drawn first)."""
    keys = {}
    for at, name in enumerate(plan.strata):
        if name == SOURCE_LENGTH:
            length = Length("current_revision__title") + Length(Cast("current_revision__fields", TextField()))
            keys[f"k{at}"] = length
        else:
            keys[f"k{at}"] = Cast(KeyTextTransform(name, "current_revision__fields"), TextField())
    base, base_params = scope.order_by().annotate(**keys).values("id", "sku", *keys).query.sql_with_params()
    banded = ", ".join(
        f"ntile({len(LENGTH_BANDS)}) OVER (ORDER BY s.{key}, s.sku) AS {key}"
        if name == SOURCE_LENGTH
        else f"s.{key}"
        for key, name in zip(keys, plan.strata, strict=True)
    )
    columns = ", ".join(f"b.{key}" for key in keys)
    # No fields: the whole scope is one stratum.
    stratum = f"dense_rank() OVER (ORDER BY {columns})" if keys else "1"
    partition = f"PARTITION BY {columns} " if keys else ""
    sql = (
        f"SELECT b.id, {columns + ', ' if keys else ''}{stratum} AS stratum, "
        f"row_number() OVER ({partition}ORDER BY md5(%s || b.sku), b.sku) AS draw "
        f"FROM (SELECT s.id, s.sku{', ' + banded if keys else ''} FROM ({base}) s) b"
    )
    return sql, [f"{plan.seed}:", *base_params]


def _strata_sql(plan: PilotPlan, ranked: str) -> str:
    keys = "".join(f", r.k{at}" for at in range(len(plan.strata)))
    return (
        f"SELECT r.stratum{keys}, count(*) FROM {ranked} r "
        f"GROUP BY r.stratum{keys} ORDER BY r.stratum LIMIT {MAX_STRATA + 1}"
    )


def _strata(plan: PilotPlan, rows: list[tuple]) -> list[Stratum]:
    strata = []
    for number, *keys, count in rows:
        values = {
            name: (LENGTH_BANDS[key - 1] if name == SOURCE_LENGTH else key) if key is not None else None
            for name, key in zip(plan.strata, keys, strict=True)
        }
        strata.append(Stratum(number, values, count, plan.arm_share(min(count, plan.per_stratum))))
    return strata


def strata_of(plan: PilotPlan, scope: QuerySet[Product]) -> list[Stratum]:
    """The strata of the scope and what the plan would draw from each (at most MAX_STRATA + 1 of them:
    enough to tell that there are too many)."""
    ranked, params = _ranked(plan, scope)
    with connection.cursor() as cursor:
        cursor.execute(_strata_sql(plan, f"({ranked})"), params)
        return _strata(plan, cursor.fetchall())


def sample_problem(strata: list[Stratum]) -> str | None:
    """Why the sample cannot be drawn, or None."""
    if len(strata) > MAX_STRATA:
        return (
            f"The fields split the scope into more than {MAX_STRATA:,} strata; a pilot draws from at most "
            f"{MAX_STRATA:,}: name fewer fields, or fields with fewer values"
        )
    drawn = sum(stratum.sample_products for stratum in strata)
    if drawn > MAX_SAMPLE:
        return (
            f"The pilot would draw {drawn:,} products; at most {MAX_SAMPLE:,}: draw fewer per stratum, "
            "or name fewer fields"
        )
    return None


def sample_size(strata: list[Stratum]) -> int:
    return sum(stratum.sample_products for stratum in strata)


def sample_products(plan: PilotPlan, scope: QuerySet[Product]) -> QuerySet[Product]:
    """The products the plan draws from the scope now, as a query (for an estimate before starting)."""
    ranked, params = _ranked(plan, scope)
    drawn = RawSQL(f"SELECT r.id FROM ({ranked}) r WHERE r.draw <= %s", [*params, plan.per_stratum])
    return Product.objects.filter(pk__in=drawn)


def record_sample(
    *, job: Job, plan: PilotPlan, scope: QuerySet[Product], scope_skus: list[str] | None
) -> Pilot:
    """Draw the sample into the ledger, in the caller's transaction: the pilot, its drawn products
    (set-wise) and its strata. Raises SampleRefused when the sample cannot be drawn.

    On PostgreSQL the products are written and the strata counted by one statement, so both see the
    scope as it is at one instant, whatever an import changes meanwhile; SQLite runs one writer at a time."""
    pilot = Pilot.objects.create(
        job=job,
        per_stratum=plan.per_stratum,
        strata=list(plan.strata),
        seed=plan.seed,
        drill=plan.drill,
        scope_skus=scope_skus,
        arm=plan.arm,
        arms=plan.arms,
        same_sample=plan.same_sample,
    )
    ranked, params = _ranked(plan, scope)
    table = connection.ops.quote_name(PilotProduct._meta.db_table)
    insert = (
        f"INSERT INTO {table} (pilot_id, product_id, stratum) "
        "SELECT %s, r.id, r.stratum FROM {ranked} r WHERE r.draw <= %s AND (r.draw - 1) %% %s = %s"
    )
    arm = [plan.per_stratum, *plan.share]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"WITH ranked AS ({ranked}), drawn AS ({insert.format(ranked='ranked')}) "
                + _strata_sql(plan, "ranked"),
                [*params, pilot.pk, *arm],
            )
        else:
            cursor.execute(insert.format(ranked=f"({ranked})"), [pilot.pk, *params, *arm])
            cursor.execute(_strata_sql(plan, f"({ranked})"), params)
        strata = _strata(plan, cursor.fetchall())
    if problem := sample_problem(strata):
        raise SampleRefused(problem)
    PilotStratum.objects.bulk_create(
        PilotStratum(
            pilot=pilot,
            number=stratum.number,
            values=stratum.values,
            scope_products=stratum.scope_products,
            sample_products=stratum.sample_products,
        )
        for stratum in strata
    )
    return pilot


def sampled_products_sql(pilot: Pilot) -> tuple[str, list]:
    """What `create_job` reads its items from (after FROM): the products drawn into the pilot."""
    return (
        f"{Product._meta.db_table} WHERE id IN "
        f"(SELECT product_id FROM {PilotProduct._meta.db_table} WHERE pilot_id = %s)",
        [pilot.pk],
    )
