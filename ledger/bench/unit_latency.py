"""Figure (i): deployed latency, from the provider's webhook saying a 50,000-line unit has ended to
every item of that unit awaiting review (issue 29, point 3: ≤ 5 s), on the database broker and on
Redis: one row each.

Each runs as a deployment does, on a database of its own that only `migrate` and the import of the
unit's products have touched: the OpenAI emulator (`run_emulator`) posting its signed
`batch.completed` to the web server (`runserver`, with OPENAI_WEBHOOK_SECRET set), and a worker
cluster (`qcluster`, BATCHDESK_WORKERS as you set them) whose schedule has started its collector
round. One job of min(products, 50,000) items is created as one unit (`create_job --unit-size`).

A real batch runs for minutes or hours, so by the time it ends its unit has long been seen open by
the collector (whose passes then leave it to the webhook) and the tables' statistics have long been
brought up to date after its sending (autovacuum, or the round where it is off). So the emulator
holds the batch in progress (an hour a request) until that is true here too: the unit observed by a
pass (every POLL_SECONDS), a round started since the unit was sent and its look at the statistics
ended (rounds start a minute apart, the first two 30 s apart: the collection then runs well before
the next one's), and the bench's ANALYZE of the database done. Then it lets the batch run to its end
at once (`per_request_ms` 0, `POST /_emulator/config`): it answers the requests, writes the results
file and posts the webhook. A round starting during a collection (one in eight or so, where
autovacuum is off, as on this project's machines) would analyse the tables being written, for a
few seconds of the database's time beside it.

The clock runs from the webhook's delivery (the emulator's `sent_at`, taken just before it posts) to
the unit's `collected` event, written once the last chunk of drafts has committed: every item then
awaits review, which the figure checks by counting them. Where the time went is printed from what
the ledger and the queue recorded. The processes are stopped and the database dropped whatever
happens; the Redis database (REDIS_URL's when it names one, else the last empty one of the local
server's) must be empty at the start and is emptied at the end."""

import contextlib
import subprocess
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg
import redis

from .base import Bench, Figure
from .catalogue_file import write_catalogue
from .clusters import DEFAULT_REDIS, free_redis_database
from .database import database_url, fresh_database, server_url
from .end_to_end import cluster, started
from .hook_latency import SECRET, free_port
from .measuring import CommandFailed, manage

NAME = "deployed latency, webhook to a unit awaiting review"
UNIT_LINES = 50_000
TARGET_SECONDS = 5.0
# The collector's passes: often enough that the unit is soon seen open (a deployment's 30 s would
# only lengthen the wait before its end; a webhooked unit observed is left to its webhook).
POLL_SECONDS = 5
# How long the emulator takes over a request until the bench lets the batch end: for ever, here.
HOLD_MS = 3_600_000
# What the cluster's schedule queues on its first look, about 30 s after the cluster starts,
# besides the collector's round: the round's look at the tables' statistics and the daily
# retention pass, first due at once after `migrate`. A cluster long at work has done both.
ROUNDS_WORK = "ledger.tasks.analyse_stale_tables"
STARTUP_WORK = (ROUNDS_WORK, "ledger.tasks.apply_retention")
FIRST_ROUND_SECONDS = 120
PATIENCE_SECONDS = 300


def measure(bench: Bench) -> list[Figure]:
    lines = min(bench.products, UNIT_LINES)
    figures = [row(bench, lines, broker="database", redis_url="")]
    try:
        redis_url = redis_database(bench.env.get("REDIS_URL", ""))
    except redis.RedisError as error:
        bench.say(f"{NAME}, Redis: not measured ({error})")
        return [*figures, Figure(f"{NAME}, Redis", "no Redis", "—", None, TARGET, None)]
    try:
        figures.append(row(bench, lines, broker="Redis", redis_url=redis_url))
    finally:
        redis.Redis.from_url(redis_url).flushdb()
    return figures


TARGET = f"≤ {TARGET_SECONDS:g} s, ratio ≥ 1"


def redis_database(named: str) -> str:
    """REDIS_URL when it names a database number that holds no key, else the last empty database of
    its server (or of the local one): emptied at the end, so never one that held keys before."""
    if named and urlsplit(named).path.strip("/"):
        if redis.Redis.from_url(named).dbsize():
            raise redis.RedisError(f"{named} holds keys, and the bench empties the Redis database it uses")
        return named
    return free_redis_database(named or DEFAULT_REDIS)


def row(bench: Bench, lines: int, *, broker: str, redis_url: str) -> Figure:
    seconds, timeline, awaiting = latency(bench, lines, redis_url=redis_url)
    bench.say(
        f"Unit latency, {broker} broker: {lines:,} lines, from the webhook to the unit collected {seconds:,.2f} s"
    )
    for line in timeline:
        bench.say(f"  {line}")
    finished = awaiting == lines
    if not finished:
        bench.say(f"Unit latency FAILED: {awaiting:,} of {lines:,} items await review")
    return Figure(
        name=f"{NAME}, {'database broker' if broker == 'database' else 'Redis'}",
        value=f"{seconds:,.2f} s ({lines:,} lines)",
        baseline=f"{TARGET_SECONDS:g} s target",
        ratio=TARGET_SECONDS / seconds if seconds > 0 else None,
        target=TARGET,
        passed=finished and seconds <= TARGET_SECONDS,
    )


def latency(bench: Bench, lines: int, *, redis_url: str) -> tuple[float, list[str], int]:
    """Seconds from the webhook's delivery to the unit collected, where they went, and how many of
    the unit's items await review."""
    server = server_url(bench.database_url)
    with fresh_database(server) as name, tempfile.TemporaryDirectory(prefix="bd_bench_") as folder:
        url = database_url(server, name)
        env = {
            **bench.env,
            "DATABASE_URL": url,
            "BATCHDESK_POLL_SECONDS": str(POLL_SECONDS),
            "OPENAI_API_KEY": "sk-bench",
            "OPENAI_WEBHOOK_SECRET": SECRET,
            "ALLOWED_HOSTS": "127.0.0.1",
        }
        env.pop("REDIS_URL", None)
        if redis_url:
            env["REDIS_URL"] = redis_url
            redis.Redis.from_url(redis_url).flushdb()
        manage("migrate", "--verbosity", "0", env=env)
        catalogue = Path(folder) / "catalogue.jsonl"
        write_catalogue(catalogue, lines)
        log = Path(folder) / "qcluster.log"
        port = free_port()
        emulator_argv = [
            *("run_emulator", "--protocol", "openai", "--port", "0", "--per-request-ms", str(HOLD_MS)),
            *("--webhook-url", f"http://127.0.0.1:{port}/hooks/openai", "--webhook-secret", SECRET),
        ]
        with contextlib.ExitStack() as running, psycopg.connect(url, autocommit=True) as connection:
            web = ["runserver", "--noreload", "--skip-checks", f"127.0.0.1:{port}"]
            running.enter_context(started(web, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            emulator = running.enter_context(
                started(emulator_argv, env=env, stdout=subprocess.PIPE, text=True)
            )
            announced = emulator.stdout.readline()
            base_url = next((word for word in announced.split() if word.startswith("http://")), None)
            if base_url is None:
                raise CommandFailed(f"the emulator did not say where it serves: {announced!r}")
            env["OPENAI_BASE_URL"] = base_url
            running.enter_context(cluster(env, log))
            manage("import_catalogue", str(catalogue), env=env)
            manage(
                "createsuperuser", "--noinput", "--username", "bench", "--email", "b@example.invalid", env=env
            )
            warm_up(f"http://127.0.0.1:{port}/api/health")
            wait_for(
                lambda: first_round_done(connection),
                what="the cluster's first round and the work it queued",
                log=log,
                seconds=FIRST_ROUND_SECONDS,
            )
            created = manage(
                *("create_job", "--reference", "unit-latency", "--task", "product_description"),
                *("--provider", "openai", "--unit-size", str(lines)),
                env=env,
            )
            job_id = int(created.output.strip().splitlines()[-1])
            unit, ref, sent = wait_for(
                lambda: connection.execute(
                    "SELECT s.id, s.provider_ref, e.at FROM ledger_submission s JOIN ledger_event e "
                    "ON e.submission_id = s.id AND e.item_id IS NULL AND e.to_state = 'open' "
                    "WHERE s.job_id = %s AND s.state = 'open' AND s.last_observed_at IS NOT NULL",
                    [job_id],
                ).fetchone(),
                what="the unit sent and seen open by the collector",
                log=log,
            )
            wait_for(
                lambda: connection.execute(
                    "SELECT 1 FROM django_q_task WHERE func = %s AND started > %s", [ROUNDS_WORK, sent]
                ).fetchone(),
                what="a collector round started since the unit was sent, and its work",
                log=log,
            )
            connection.execute("ANALYZE")
            httpx.post(
                str(httpx.URL(base_url).join("/_emulator/config")), json={"per_request_ms": 0}, timeout=10
            )
            wait_for(
                lambda: connection.execute(
                    "SELECT 1 FROM ledger_submission WHERE id = %s AND state = 'collected'", [unit]
                ).fetchone(),
                what="the unit collected",
                log=log,
            )
            sent_at = webhook_sent_at(base_url, ref)
            moments = timeline(connection, unit, job_id)
            (awaiting,) = connection.execute(
                "SELECT count(*) FROM ledger_item WHERE job_id = %s AND state = 'awaiting_review'", [job_id]
            ).fetchone()
    if sent_at is None:
        raise CommandFailed("unit latency: the emulator posted no webhook for the unit")
    collected = next(at for label, at in moments if label == COLLECTED)
    return collected - sent_at, told(sent_at, moments), awaiting


def first_round_done(connection: psycopg.Connection) -> bool:
    polled = connection.execute(
        "SELECT 1 FROM ledger_collectorheartbeat WHERE name = 'collector' AND last_poll_at IS NOT NULL"
    ).fetchone()
    done = connection.execute(
        "SELECT count(DISTINCT func) FROM django_q_task WHERE func = ANY(%s)", [list(STARTUP_WORK)]
    ).fetchone()[0]
    return bool(polled) and done == len(STARTUP_WORK)


def warm_up(url: str) -> None:
    """One request to the web server, once it answers: a server long at work has imported what its
    first request needs."""
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(url, timeout=30)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def wait_for(condition: Callable[[], object], *, what: str, log: Path, seconds: float = PATIENCE_SECONDS):
    """What `condition` gives once it gives something, looked at five times a second."""
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise CommandFailed(
                f"unit latency: waited {seconds:.0f} s for {what}; the cluster's log ends:\n"
                f"{log.read_text(errors='replace')[-3000:]}"
            )
        time.sleep(0.2)
    return found


def webhook_sent_at(base_url: str, ref: str) -> float | None:
    """When the emulator posted the unit's webhook (epoch seconds, its first delivery)."""
    stats = httpx.get(str(httpx.URL(base_url).join("/_emulator/stats")), timeout=10).json()
    return min((sent["sent_at"] for sent in stats["webhooks"] if sent["unit"] == ref), default=None)


COLLECTED = "unit collected"


def timeline(connection: psycopg.Connection, unit: int, job_id: int) -> list[tuple[str, float]]:
    """What the ledger and the queue recorded from the webhook to the unit collected, as (what,
    epoch seconds), in order."""
    moments = [
        (f"webhook recorded by the web tier ({outcome})", epoch(received_at))
        for received_at, outcome in connection.execute(
            "SELECT received_at, outcome FROM ledger_providerhint WHERE submission_id = %s ORDER BY id",
            [unit],
        )
    ]
    ended, collected = connection.execute(
        "SELECT min(at) FILTER (WHERE to_state = 'ended'), min(at) FILTER (WHERE to_state = 'collected') "
        "FROM ledger_event WHERE submission_id = %s AND item_id IS NULL",
        [unit],
    ).fetchone()
    (observed,) = connection.execute(
        "SELECT last_observed_at FROM ledger_submission WHERE id = %s", [unit]
    ).fetchone()
    first, last = connection.execute(
        "SELECT min(at), max(at) FROM ledger_event WHERE job_id = %s AND to_state = 'awaiting_review'",
        [job_id],
    ).fetchone()
    moments += [
        ("batch's status asked by a worker (its last observation)", epoch(observed)),
        ("batch seen ended by a worker (its poll)", epoch(ended)),
        ("first items awaiting review (first chunk)", epoch(first)),
        ("last items awaiting review (last chunk)", epoch(last)),
        (COLLECTED, epoch(collected)),
    ]
    # The queue's record of each task queued since (django-q's `started` is when a task was queued),
    # the rounds' aside: they run on.
    since = min(at for _, at in moments) - 1
    for func, queued, stopped in task_records(connection, since):
        moments += [(f"task {func} queued", queued), (f"task {func} ended", stopped)]
    return sorted(moments, key=lambda moment: moment[1])


def task_records(
    connection: psycopg.Connection, since: float, wait: float = 5
) -> list[tuple[str, float, float]]:
    """(function, queued, ended) of the tasks queued after `since` but the rounds, once the unit's
    poll is among them (a cluster saves a task's record just after it ends), or after `wait` s."""
    deadline = time.monotonic() + wait
    while True:
        rows = connection.execute(
            "SELECT func, extract(epoch FROM started), extract(epoch FROM stopped) FROM django_q_task "
            "WHERE started > to_timestamp(%s) AND func <> 'ledger.tasks.collect_round' ORDER BY started",
            [since],
        ).fetchall()
        if any(func == "ledger.tasks.poll_submission" for func, _, _ in rows) or time.monotonic() > deadline:
            return [
                (func.removeprefix("ledger.tasks."), float(queued), float(stopped))
                for func, queued, stopped in rows
            ]
        time.sleep(0.2)


def epoch(moment: datetime | None) -> float:
    return moment.timestamp() if moment else float("nan")


def told(sent_at: float, moments: list[tuple[str, float]]) -> list[str]:
    return ["webhook posted by the provider (emulator) +0.00 s"] + [
        f"{label} {at - sent_at:+,.2f} s" for label, at in moments
    ]
