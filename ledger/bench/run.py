"""One bench run: a fresh database, a generated catalogue, every figure in order, then the table.
The database and the file are removed at the end whatever happens."""

import os
import secrets
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from . import clusters, collection, end_to_end, hook_latency, importing, job_creation, screens, unit_latency
from .base import Bench, Figure
from .catalogue_file import write_catalogue
from .database import database_url, fresh_database, server_url
from .measuring import manage

# The run's order matters: the job is created over the products the import wrote, its first items
# are collected and the screens show all of it. The two-cluster figure (two small jobs through one
# worker cluster, then two), the end to end figure and the deployed latency figure each run on a
# database of their own.
FIGURES = {
    "import": importing,
    "create_job": job_creation,
    "collection": collection,
    "screens": screens,
    "clusters": clusters,
    "end_to_end": end_to_end,
    "hook_latency": hook_latency,
    "unit_latency": unit_latency,
}
# What each figure needs measured before it, on the run's database.
NEEDS = {
    "import": (),
    "create_job": ("import",),
    "collection": ("import", "create_job"),
    "screens": ("import", "create_job", "collection"),
    "clusters": (),
    "end_to_end": (),
    "hook_latency": (),
    "unit_latency": (),
}
# Figures run only when named (`--figures hook_latency`): minutes of waiting on 30 s polls, and
# on the collector's rounds (three minutes for the deployed latency's two rows).
ONLY_WHEN_NAMED = ("hook_latency", "unit_latency")
# `make bench-quick` (issue 29, point 5): the hot paths in under two minutes, before a push; the
# screens among them are `screens.QUICK_SCREENS`.
QUICK_PRODUCTS = 20_000
QUICK_FIGURES = ("import", "create_job", "collection", "screens")


def figures_to_run(chosen: list[str] | None) -> list[str]:
    """The chosen figures (all by default) and what they need, in the run's order."""
    if not chosen:
        return [name for name in FIGURES if name not in ONLY_WHEN_NAMED]
    unknown = [name for name in chosen if name not in FIGURES]
    if unknown:
        raise ValueError(f"Unknown figure {', '.join(unknown)}; the figures are {', '.join(FIGURES)}")
    wanted = {need for name in chosen for need in (name, *NEEDS[name])}
    return [name for name in FIGURES if name in wanted]


# Issue 9's other figures, with their targets, until each has its module.
NOT_MEASURED_YET: tuple[tuple[str, str], ...] = ()


def run_bench(
    *,
    products: int,
    say: Callable[[str], None],
    figures: list[str] | None = None,
    server_answer_ms: int = clusters.SERVER_ANSWER_MS,
    quick: bool = False,
) -> list[Figure]:
    names = figures_to_run(figures)
    server = server_url(os.environ.get("DATABASE_URL", ""))
    with fresh_database(server) as name, tempfile.TemporaryDirectory(prefix="bd_bench_") as folder:
        say(f"Database {name} on {server} (dropped at the end)")
        url = database_url(server, name)
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "DEBUG": "0",
            "SECRET_KEY": os.environ.get("SECRET_KEY") or secrets.token_urlsafe(40),
            "LOG_LEVEL": "WARNING",
        }
        catalogue = Path(folder) / "catalogue.jsonl"
        started = time.perf_counter()
        size = write_catalogue(catalogue, products)
        say(
            f"Catalogue: {products:,} products, {size / products:,.0f} bytes each "
            f"({size / 1_000_000:,.1f} MB) in {time.perf_counter() - started:,.1f} s"
        )
        migrated = manage("migrate", "--verbosity", "0", env=env)
        say(f"Migrated in {migrated.seconds:,.1f} s")
        idle = manage("check", "--database", "default", env=env)
        say(
            f"A Django process that only starts and connects: {idle.seconds:,.2f} s, peak {idle.peak_mb:,.0f} MB"
        )
        bench = Bench(
            products=products,
            catalogue=catalogue,
            database_url=url,
            env=env,
            idle=idle,
            say=say,
            server_answer_ms=server_answer_ms,
            quick=quick,
        )
        measured = []
        for figure in names:
            measured.extend(FIGURES[figure].measure(bench))
    say(f"Database {name} dropped")
    return measured


def ratio_shown(ratio: float) -> str:
    """Three significant digits, never in exponent form: a tiny run can make a ratio huge (an import
    over before the idle Django start's noise) or tiny, and the table is read by people and tests."""
    if ratio >= 100:
        return f"{ratio:,.0f}"
    if ratio >= 0.001:
        return f"{ratio:.3g}"
    return f"{ratio:.6f}"


def table(figures: list[Figure]) -> str:
    header = ("figure", "value", "baseline", "ratio", "target", "result")
    rows = [
        (
            figure.name,
            figure.value,
            figure.baseline,
            "—" if figure.ratio is None else ratio_shown(figure.ratio),
            figure.target,
            {True: "pass", False: "FAIL", None: "—"}[figure.passed],
        )
        for figure in figures
    ]
    rows += [(name, "not measured yet", "—", "—", target, "—") for name, target in NOT_MEASURED_YET]
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
