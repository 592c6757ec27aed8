"""Figures (a) and (b): `import_catalogue` of new products, then of the same file unchanged, each
against PostgreSQL's `COPY` of the same lines (issue 9, point 2: ≥ 25 % and ≥ 50 % of its rows/s);
and between them the import's ceiling (`copy_ledger`) against the same baseline."""

import sys

from .base import Bench, Figure, described, memory_figure
from .measuring import CommandFailed, run_measured


def measure(bench: Bench) -> list[Figure]:
    rows = bench.products
    copy = run_measured(
        [sys.executable, "-m", "ledger.bench.copy_rows", bench.database_url, str(bench.catalogue)],
        env=bench.env,
    )
    bench.say(f"COPY baseline: {described(copy, rows, 'rows')}")
    figures = []
    for name, expected, share in (
        ("import, new products", f"created {rows}", 0.25),
        ("import, unchanged re-import", f"unchanged {rows}", 0.50),
    ):
        # Django's start, timed again right before the import: on a busy machine one idle start
        # may take twice another, and the unchanged re-import takes about as long as one.
        idle = min(bench.idle.seconds, bench.manage("check", "--database", "default").seconds)
        run = bench.manage("import_catalogue", str(bench.catalogue))
        if expected not in run.output:
            raise CommandFailed(f"{name}: expected {expected!r}, the command said:\n{run.output}")
        # Both processes start Python; the import's also starts Django, which the idle runs time
        # (its connection included): counted out, as for the collection, so the rate is the import's.
        # The quickest idle start is counted out, so the import is never credited with more.
        importing = max(run.seconds - idle, 1e-6)
        rate = rows / importing
        bench.say(
            f"{name}: {described(run, rows, 'rows')}; {importing:,.2f} s after Django started = {rate:,.0f} rows/s"
        )
        ratio = rate / copy.per_second(rows)
        figures.append(
            Figure(
                name=name,
                value=f"{rate:,.0f} rows/s",
                baseline=f"{copy.per_second(rows):,.0f} rows/s COPY",
                ratio=ratio,
                target=f"ratio ≥ {share:.2f} ({share:.0%} of COPY)",
                passed=ratio >= share,
            )
        )
        if name.endswith("new products"):
            figures.append(memory_figure(name, run, bench))
            figures.append(ceiling(bench, rows, copy.per_second(rows)))
    return figures


def ceiling(bench: Bench, rows: int, copy_rate: float) -> Figure:
    """The rows the import of new products wrote, COPYed again into tables like the ledger's
    (`copy_ledger`): what no import can beat, against the same baseline. Not judged."""
    tool = [sys.executable, "-m", "ledger.bench.copy_ledger"]
    folder = str(bench.catalogue.parent)
    run_measured([*tool, "export", bench.database_url, folder], env=bench.env)
    try:
        load = run_measured([*tool, "load", bench.database_url, folder], env=bench.env)
    finally:
        run_measured([*tool, "drop", bench.database_url], env=bench.env)
    bench.say(f"the ledger's tables loaded by COPY, the import's ceiling: {described(load, rows, 'rows')}")
    return Figure(
        name="import, new products: ceiling",
        value=f"{load.per_second(rows):,.0f} rows/s",
        baseline=f"{copy_rate:,.0f} rows/s COPY",
        ratio=load.per_second(rows) / copy_rate,
        target="— (its rows COPYed into the ledger's tables)",
        passed=None,
    )
