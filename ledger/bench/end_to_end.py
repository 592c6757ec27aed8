"""Figure (g): the whole way, from `import_catalogue` of the bench's catalogue to every draft awaiting
review, against the built-in emulator with no processing delay (issue 29, point 4: ≤ 3 minutes at
1,200,000 products, scaled here linearly to the run's size).

It runs as a deployment does, on a database of its own that only `migrate` has touched: the
emulator and a worker cluster (`qcluster`, with the collector passing every second) are started
first and the collector's first pass is waited for, as it would long have been running; then the
clock runs over `import_catalogue`, `create_job` and the workers' work until the job's tallies show
no item still outstanding. The cluster and the emulator are stopped whatever happens."""

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from django.conf import settings

from .base import Bench, Figure
from .database import database_url, fresh_database, server_url
from .launch import STOPS, _accept_stops
from .measuring import MANAGE, CommandFailed, manage

NAME = "end to end, import to every draft awaiting review"
TARGET_SECONDS, TARGET_PRODUCTS = 180, 1_200_000
TARGET_PER_SECOND = TARGET_PRODUCTS / TARGET_SECONDS
# How often the collector passes over the ledger (a deployment's default is 30 s).
POLL_SECONDS = 1
# A cluster's collector round starts from its scheduler, whose first look comes 30 s after it starts.
FIRST_PASS_SECONDS = 120
# How long a cluster may take to stop on SIGTERM before it is killed.
STOP_SECONDS = 15
OUTSTANDING = ("prepared", "submitted", "submission_uncertain", "returned")


def target_seconds(products: int) -> float:
    return TARGET_SECONDS * products / TARGET_PRODUCTS


def patience(products: int) -> float:
    """How long the drafts are waited for before the figure fails: far past the target, so that a
    run well short of it still says by how much, and never for ever."""
    return 10 * target_seconds(products) + 300


def measure(bench: Bench) -> list[Figure]:
    products = bench.products
    server = server_url(bench.database_url)
    with fresh_database(server) as name, tempfile.TemporaryDirectory(prefix="bd_bench_") as folder:
        url = database_url(server, name)
        env = {**bench.env, "DATABASE_URL": url, "BATCHDESK_POLL_SECONDS": str(POLL_SECONDS)}
        manage("migrate", "--verbosity", "0", env=env)
        log = Path(folder) / "qcluster.log"
        with emulator(env) as base_url:
            env["BATCHDESK_EMULATOR_URL"] = base_url
            with cluster(env, log):
                # create_job's owner; made while the cluster's scheduler comes round.
                manage(
                    "createsuperuser",
                    "--noinput",
                    "--username",
                    "bench",
                    "--email",
                    "bench@example.invalid",
                    env=env,
                )
                waited = wait_for_first_pass(url, log)
                bench.say(
                    f"End to end: database {name}, emulator at {base_url}, a cluster of "
                    f"{settings.BATCHDESK_WORKERS} workers on "
                    f"{'Redis' if env.get('REDIS_URL') else 'the database as broker'}, the collector "
                    f"passing every {POLL_SECONDS} s (its first pass came {waited:,.0f} s after the cluster started)"
                )
                clock = datetime.now(UTC)
                started = time.perf_counter()
                imported = manage("import_catalogue", str(bench.catalogue), env=env)
                created = manage(
                    "create_job",
                    "--reference",
                    "bench",
                    "--task",
                    "product_description",
                    "--provider",
                    "emulator",
                    env=env,
                )
                job_id = int(created.output.strip().splitlines()[-1])
                timeout = patience(products)
                counts = wait_for_drafts(url, job_id, timeout=timeout)
                seconds = time.perf_counter() - started
        finished = counts.get("awaiting_review", 0) == products and not outstanding(counts)
        to_drafts = seconds - imported.seconds - created.seconds
        bench.say(
            f"End to end: {seconds:,.1f} s = import {imported.seconds:,.1f} s + create_job {created.seconds:,.1f} s + "
            + (
                f"{to_drafts:,.1f} s to every draft awaiting review"
                if finished
                else f"{to_drafts:,.1f} s, given up"
            )
        )
        for line in stages(url, job_id, clock):
            bench.say(f"  {line}")
        if finished:
            # The tallies were waited on; the items themselves, counted once, must agree.
            counts = item_counts(url, job_id)
            finished = counts == {"awaiting_review": products}
        if not finished:
            bench.say(f"End to end FAILED: the job's items by state: {counts}")
            bench.say(f"The cluster's log ends:\n{log.read_text(errors='replace')[-3000:]}")
    return [figure(products, seconds, counts.get("awaiting_review", 0), finished)]


def figure(products: int, seconds: float, awaiting: int, finished: bool) -> Figure:
    rate = products / seconds
    target = target_seconds(products)
    return Figure(
        name=NAME,
        value=f"{rate:,.0f} items/s ({seconds:,.1f} s)"
        if finished
        else f"{awaiting:,} of {products:,} after {seconds:,.0f} s",
        baseline=f"{TARGET_PER_SECOND:,.0f} items/s target ({TARGET_SECONDS} s × {products:,} / 1.2 M = {target:,.1f} s)",
        ratio=rate / TARGET_PER_SECOND if finished else None,
        target=f"≤ {TARGET_SECONDS // 60} min at 1.2 M products, ratio ≥ 1",
        passed=finished and rate >= TARGET_PER_SECOND,
    )


@contextmanager
def started(argv: list[str], *, env: dict[str, str], **popen) -> Iterator[subprocess.Popen]:
    """A manage.py command in a process group of its own (a cluster forks its workers into it),
    stopped with its whole group on the way out, whatever happens; a Ctrl-C or SIGTERM arriving
    while it starts is held back until it can be stopped (as `launch.run_child` does)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        process = subprocess.Popen(
            [sys.executable, str(MANAGE), *argv],
            env=env,
            cwd=MANAGE.parent,
            process_group=0,
            preexec_fn=_accept_stops,
            **popen,
        )
    except BaseException:
        _accept_stops()
        raise
    try:
        _accept_stops()
        yield process
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)  # a second Ctrl-C must not cut the stop short
        try:
            stop_group(process)
        finally:
            _accept_stops()


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to the group (a cluster's workers die at once; a round in progress is taken over by
    the ledger's leases, and this database is dropped next anyway), SIGKILL for what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            continue
    if process.stdout:
        process.stdout.close()


@contextmanager
def emulator(env: dict[str, str]) -> Iterator[str]:
    """The OpenAI emulator provider `emulator` speaks, on a port it picks; yields its base URL."""
    argv = ["run_emulator", "--protocol", "openai", "--port", "0", "--per-request-ms", "0"]
    with started(argv, env=env, stdout=subprocess.PIPE, text=True) as process:
        announced = process.stdout.readline()
        base_url = next((word for word in announced.split() if word.startswith("http://")), None)
        if base_url is None:
            raise CommandFailed(f"the emulator did not say where it serves: {announced!r}")
        yield base_url


@contextmanager
def cluster(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen]:
    with (
        log.open("wb") as sink,
        started(["qcluster"], env=env, stdout=sink, stderr=subprocess.STDOUT) as process,
    ):
        yield process


def wait_for_first_pass(url: str, log: Path) -> float:
    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as connection:
        while time.perf_counter() - started < FIRST_PASS_SECONDS:
            row = connection.execute(
                "SELECT 1 FROM ledger_collectorheartbeat WHERE name = 'collector' AND last_poll_at IS NOT NULL"
            ).fetchone()
            if row:
                return time.perf_counter() - started
            time.sleep(0.5)
    raise CommandFailed(
        f"end to end: the collector made no pass within {FIRST_PASS_SECONDS} s of the cluster's start; "
        f"its log ends:\n{log.read_text(errors='replace')[-3000:]}"
    )


def outstanding(counts: dict[str, int]) -> int:
    return sum(counts.get(state, 0) for state in OUTSTANDING)


def wait_for_drafts(url: str, job_id: int, *, timeout: float) -> dict[str, int]:
    """The job's items by state, from the tallies the database keeps (a sum over a few rows, where
    counting a million items every second would load the machine being measured), once none is
    outstanding or the time is up."""
    deadline = time.perf_counter() + timeout
    with psycopg.connect(url, autocommit=True) as connection:
        while True:
            counts = dict(
                connection.execute(
                    "SELECT state, sum(items)::bigint FROM ledger_itemtally WHERE job_id = %s "
                    "GROUP BY state HAVING sum(items) <> 0",
                    [job_id],
                ).fetchall()
            )
            if (counts and not outstanding(counts)) or time.perf_counter() > deadline:
                return counts
            time.sleep(1)


def item_counts(url: str, job_id: int) -> dict[str, int]:
    with psycopg.connect(url) as connection:
        return dict(
            connection.execute(
                "SELECT state, count(*) FROM ledger_item WHERE job_id = %s GROUP BY state", [job_id]
            ).fetchall()
        )


def stages(url: str, job_id: int, clock: datetime) -> list[str]:
    """Where the workers' time went, from the submissions' events: when the units were planned,
    sent, seen ended at the provider and collected (from the start of the clock), and how long
    each step took a unit."""
    with psycopg.connect(url) as connection:
        units = connection.execute(
            """
            SELECT min(e.at) FILTER (WHERE e.to_state = 'intent'),
                   min(e.at) FILTER (WHERE e.to_state = 'open'),
                   min(e.at) FILTER (WHERE e.to_state = 'ended'),
                   min(e.at) FILTER (WHERE e.to_state = 'collected')
            FROM ledger_submission s JOIN ledger_event e ON e.submission_id = s.id AND e.item_id IS NULL
            WHERE s.job_id = %s
            GROUP BY s.id
            """,
            [job_id],
        ).fetchall()
        (size,) = connection.execute("SELECT unit_size FROM ledger_job WHERE id = %s", [job_id]).fetchone()
    if not units:
        return ["no unit was planned"]
    lines = [f"{len(units):,} units of up to {size:,} requests"]
    for label, index in (("planned", 0), ("sent", 1), ("ended at the provider", 2), ("collected", 3)):
        times = [unit[index] for unit in units if unit[index] is not None]
        if times:
            first, last = ((moment - clock).total_seconds() for moment in (min(times), max(times)))
            lines.append(
                f"{label}: {len(times):,} units, the first at +{first:,.1f} s, the last at +{last:,.1f} s"
            )
    for label, begin, end in (
        ("planned → sent", 0, 1),
        ("sent → seen ended (provider and polling)", 1, 2),
        ("ended → collected (queue wait, download, recording, validation)", 2, 3),
    ):
        spans = sorted(
            (unit[end] - unit[begin]).total_seconds()
            for unit in units
            if unit[begin] is not None and unit[end] is not None
        )
        if spans:
            lines.append(
                f"{label}: median {spans[len(spans) // 2]:,.2f} s, max {spans[-1]:,.2f} s, "
                f"sum {sum(spans):,.1f} s"
            )
    return lines
