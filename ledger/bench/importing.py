"""Figures (a) and (b): `import_catalogue` of new products, judged against its ceiling measured in
the same run (`copy_ledger`: the rows it wrote, loaded by `COPY` into the ledger's own tables and
indexes; SPEC §10: at least 80 % of it), then of the same file unchanged, against PostgreSQL's
`COPY` of the same lines (issue 9, point 2: ≥ 50 % of its rows/s). The ceiling is shown against
that `COPY` too, not judged: it says how much of `COPY`'s speed the ledger's tables leave."""

import sys

from .base import TOO_SHORT, Bench, Figure, described, memory_figure, verdict, work_seconds
from .measuring import CommandFailed, Run, run_measured

# SPEC §10: the import of new products reaches at least this share of its ceiling's rows/s.
CEILING_SHARE = 0.80
# Issue 9, point 2: the unchanged re-import reaches at least this share of COPY's rows/s.
COPY_SHARE = 0.50


def measure(bench: Bench) -> list[Figure]:
    rows = bench.products
    copy = run_measured(
        [sys.executable, "-m", "ledger.bench.copy_rows", bench.database_url, str(bench.catalogue)],
        env=bench.env,
    )
    copy_rate = copy.per_second(rows)
    bench.say(f"COPY baseline: {described(copy, rows, 'rows')}")

    new, new_rate, new_judged = imported(bench, "import, new products", f"created {rows}")
    ceiling_rate = ceiling(bench, rows)
    _, unchanged_rate, unchanged_judged = imported(bench, "import, unchanged re-import", f"unchanged {rows}")
    return [
        judged(
            "import, new products", new_rate, ceiling_rate, "ceiling", CEILING_SHARE, long_enough=new_judged
        ),
        memory_figure("import, new products", new, bench),
        Figure(
            name="import, new products: ceiling",
            value=f"{ceiling_rate:,.0f} rows/s",
            baseline=f"{copy_rate:,.0f} rows/s COPY",
            ratio=ceiling_rate / copy_rate,
            target="— (its rows COPYed into the ledger's tables, once connected)",
            passed=None,
        ),
        judged(
            "import, unchanged re-import",
            unchanged_rate,
            copy_rate,
            "COPY",
            COPY_SHARE,
            long_enough=unchanged_judged,
        ),
    ]


def imported(bench: Bench, name: str, expected: str) -> tuple[Run, float, bool]:
    """One `import_catalogue` of the bench's file: its run, its rows/s after Django started, and
    whether it took long enough to be judged (`work_seconds`)."""
    rows = bench.products
    # Django's start, timed again right before the import: on a busy machine one idle start
    # may take twice another, and the unchanged re-import takes about as long as one.
    idle = min(bench.idle.seconds, bench.manage("check", "--database", "default").seconds)
    run = bench.manage("import_catalogue", str(bench.catalogue))
    if expected not in run.output:
        raise CommandFailed(f"{name}: expected {expected!r}, the command said:\n{run.output}")
    # Both processes start Python; the import's also starts Django, which the idle runs time
    # (its connection included): counted out, as for the collection, so the rate is the import's.
    # The quickest idle start is counted out, so the import is never credited with more.
    importing, judged_ = work_seconds(run, idle)
    rate = rows / importing
    bench.say(
        f"{name}: {described(run, rows, 'rows')}; {importing:,.2f} s after Django started = {rate:,.0f} rows/s"
    )
    return run, rate, judged_


def judged(
    name: str, rate: float, baseline_rate: float, baseline: str, share: float, *, long_enough: bool = True
) -> Figure:
    ratio = rate / baseline_rate
    return Figure(
        name=name,
        value=f"{rate:,.0f} rows/s" + ("" if long_enough else TOO_SHORT),
        baseline=f"{baseline_rate:,.0f} rows/s {baseline}",
        ratio=ratio,
        target=f"ratio ≥ {share:.2f} ({share:.0%} of {baseline})",
        passed=verdict(ratio >= share, long_enough),
    )


def ceiling(bench: Bench, rows: int) -> float:
    """The rows the import of new products wrote, COPYed again into tables like the ledger's
    (`copy_ledger`): what no import can beat. Returns its rows/s once connected, the import's
    figure being timed once Django has started and connected."""
    tool = [sys.executable, "-m", "ledger.bench.copy_ledger"]
    folder = str(bench.catalogue.parent)
    run_measured([*tool, "export", bench.database_url, folder], env=bench.env)
    try:
        load = run_measured([*tool, "load", bench.database_url, folder], env=bench.env)
    finally:
        run_measured([*tool, "drop", bench.database_url], env=bench.env)
    loading = max(float(load.output.split()[-1]), 1e-6)
    rate = rows / loading
    bench.say(
        f"the ledger's tables loaded by COPY, the import's ceiling: {described(load, rows, 'rows')}; "
        f"{loading:,.2f} s once connected = {rate:,.0f} rows/s"
    )
    return rate
