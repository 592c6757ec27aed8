"""Figure (c): `create_job` over every product (issue 29, point 1: a million items in ≤ 10 s; issue 9,
point 3: memory flat in the job's size). The issues give it no baseline of its own: the target is a
rate."""

import psycopg

from .base import TOO_SHORT, Bench, Figure, described, memory_figure, verdict, work_seconds
from .measuring import CommandFailed

TARGET_ITEMS_PER_SECOND = 1_000_000 / 10


def measure(bench: Bench) -> list[Figure]:
    rows = bench.products
    bench.manage("createsuperuser", "--noinput", "--username", "bench", "--email", "bench@example.invalid")
    run = bench.manage(
        "create_job", "--reference", "bench", "--task", "product_description", "--provider", "emulator"
    )
    job_id = int(run.output.strip().splitlines()[-1])
    with psycopg.connect(bench.database_url) as connection:
        (items,) = connection.execute(
            "SELECT count(*) FROM ledger_item WHERE job_id = %s", [job_id]
        ).fetchone()
    if items != rows:
        raise CommandFailed(f"create_job made {items} items for {rows} products")
    # Django's own start (timed by the idle run, its connection included) is counted out, as for the
    # import and the collection, so the rate is the job's creation.
    creating, long_enough = work_seconds(run, bench.idle.seconds)
    rate = rows / creating
    bench.say(
        f"create_job: {described(run, rows, 'items')}; {creating:,.2f} s after Django started = {rate:,.0f} items/s"
    )
    return [
        Figure(
            name="create_job, every product",
            value=f"{rate:,.0f} items/s" + ("" if long_enough else TOO_SHORT),
            baseline="—",
            ratio=None,
            target=f"≥ {TARGET_ITEMS_PER_SECOND:,.0f} items/s (1 M in ≤ 10 s)",
            passed=verdict(rate >= TARGET_ITEMS_PER_SECOND, long_enough),
        ),
        memory_figure("create_job", run, bench),
    ]
