"""Figure (e): two worker clusters on Redis against one (issue 9, point 5: ≥ 1.7 × one cluster's
throughput on a job with many units).

What a second machine adds is workers that can wait. The job goes to a self-hosted model server
(the `openai_compatible` emulator) that answers each request in SERVER_ANSWER_MS (`--server-answer-ms`) of real time (a
few hundred tokens from a busy server) on a thread of its own, as a server with room for many
requests at once does: a worker collecting a unit spends its time waiting for answers
(CONCURRENCY in flight, one unit's worth), not computing. The job's time is then set by how many
workers wait at once, which a second cluster doubles, and neither by this machine's two cores
(recording an answer costs milliseconds beside seconds of waiting) nor by the server. A
CPU-bound job would not show a second machine's worth on one two-core machine, and a batch
provider's own processing time no worker can shorten. The collector's round holds one worker of
one cluster: one cluster of WORKERS works with WORKERS - 1, two with 2 × WORKERS - 1, so 7 / 3 is
the most the ratio can be; UNITS is a multiple of both. A cluster takes a task or two from Redis
beyond those its workers run (its pusher holds one while its queue is full), so a job's last units
may wait for a busy cluster while the other's workers are free: with 21 units, two clusters took
four waves of answers instead of three (33 s against 58 s for one cluster, ratios 1.72-1.79 in
seven runs), the tail weighing a quarter of the job; 42 units, a job of many units, halve its weight.

Each run starts its clusters (`qcluster` in process groups of their own, WORKERS each, on one
Redis database nobody else uses, emptied before and after), starts a collector round and waits
for its first pass, then creates the job with `create_job` and takes the time from the job's
creation to the last of its items awaiting review, both read from the ledger."""

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import redis

from .base import Bench, Figure
from .catalogue_file import write_catalogue
from .database import database_url, fresh_database, server_url
from .launch import STOPS
from .launch import _accept_stops as accept_stops
from .measuring import MANAGE, CommandFailed, manage

WORKERS = 4
UNITS = 42
# One request per thread of a worker's: a unit is one wait of the server's answer time.
UNIT_SIZE = CONCURRENCY = 8
SERVER_ANSWER_MS = 8000
TARGET = 1.7
DEFAULT_REDIS = "redis://127.0.0.1:6379"
NAME = "two worker clusters on Redis against one"


def measure(bench: Bench) -> list[Figure]:
    try:
        redis_url = free_redis_database(bench.env.get("REDIS_URL") or DEFAULT_REDIS)
    except redis.RedisError as error:
        bench.say(f"{NAME}: not measured, Redis cannot be reached ({error})")
        return [Figure(NAME, "no Redis", "—", None, f"ratio ≥ {TARGET}", None)]
    server = server_url(bench.database_url)
    with fresh_database(server) as database, tempfile.TemporaryDirectory(prefix="bd_bench_") as folder:
        url = database_url(server, database)
        own = replace(bench, database_url=url, env={**bench.env, "DATABASE_URL": url})
        return measure_on(own, Path(folder) / "catalogue.jsonl", redis_url)


def measure_on(bench: Bench, catalogue: Path, redis_url: str) -> list[Figure]:
    """The figure on a database of its own, which only `migrate` and an import of the job's products
    have touched: the bench's own job, whose provider's emulator has stopped, would take the
    workers' time there."""
    bench.manage("migrate", "--verbosity", "0")
    write_catalogue(catalogue, UNITS * UNIT_SIZE)
    bench.manage("import_catalogue", str(catalogue))
    bench.manage("createsuperuser", "--noinput", "--username", "bench", "--email", "bench@example.invalid")
    with psycopg.connect(bench.database_url) as connection:
        skus = [sku for (sku,) in connection.execute("SELECT sku FROM ledger_product ORDER BY id")]
    with processes() as started:
        server_url = emulator(bench, started)
        env = {
            **bench.env,
            "REDIS_URL": redis_url,
            "BATCHDESK_WORKERS": str(WORKERS),
            "BATCHDESK_POLL_SECONDS": "1",
            "OPENAI_COMPATIBLE_BASE_URL": server_url,
            "OPENAI_COMPATIBLE_API_KEY": "bench",
            "OPENAI_COMPATIBLE_CONCURRENCY": str(CONCURRENCY),
        }
        try:
            one = run(bench, env, clusters=1, skus=skus)
            two = run(bench, env, clusters=2, skus=skus)
        finally:
            redis.Redis.from_url(redis_url).flushdb()
        stats = httpx.URL(server_url).copy_with(path="/_emulator/stats")
        asked = httpx.get(stats, timeout=10).json()
    # Each request asked once: no unit was collected by two workers.
    twice = sum(1 for calls in asked["calls_by_custom_id"].values() if calls > 1)
    bench.say(f"{NAME}: requests the server was asked more than once: {twice}")
    items = len(skus)
    ratio = one / two
    return [
        Figure(
            name=NAME,
            value=f"{items / two:,.1f} items/s",
            baseline=f"{items / one:,.1f} items/s, 1 cluster",
            ratio=ratio,
            target=f"ratio ≥ {TARGET}",
            passed=ratio >= TARGET and not twice,
        )
    ]


def run(bench: Bench, env: dict[str, str], *, clusters: int, skus: list[str]) -> float:
    """Seconds from the job's creation to its last item awaiting review, with `clusters` clusters."""
    redis.Redis.from_url(env["REDIS_URL"]).flushdb()
    with processes() as started:
        for _ in range(clusters):
            start(started, ["qcluster"], env)
        with psycopg.connect(bench.database_url, autocommit=True) as connection:
            (before,) = connection.execute("SELECT now()").fetchone()
            manage(
                "shell",
                "-c",
                "from django_q.tasks import async_task; async_task('ledger.tasks.collect_round')",
                env=env,
            )
            wait_for(
                lambda: connection.execute(
                    "SELECT 1 FROM ledger_collectorheartbeat WHERE name = 'collector' AND last_poll_at > %s",
                    [before],
                ).fetchone(),
                what="the collector's first pass",
            )
            reference = f"bench-clusters-{clusters}"
            created = manage(
                "create_job",
                "--reference",
                reference,
                "--task",
                "product_description",
                "--provider",
                "openai_compatible",
                "--skus",
                ",".join(skus),
                "--unit-size",
                str(UNIT_SIZE),
                env=env,
            )
            job_id = int(created.output.strip().splitlines()[-1])
            wait_for(
                lambda: connection.execute(
                    "SELECT count(*) = %s FROM ledger_item WHERE job_id = %s AND state = 'awaiting_review'",
                    [len(skus), job_id],
                ).fetchone()[0],
                what=f"every item of {reference} to await review",
                timeout=600,
            )
            (seconds,) = connection.execute(
                """SELECT extract(epoch FROM max(event.at) - job.created_at) FROM ledger_event event
                JOIN ledger_job job ON job.id = event.job_id
                WHERE event.job_id = %s AND event.to_state = 'awaiting_review' GROUP BY job.created_at""",
                [job_id],
            ).fetchone()
    seconds = float(seconds)
    units = -(-len(skus) // UNIT_SIZE)
    bench.say(
        f"{clusters} cluster(s) of {WORKERS} workers: {len(skus):,} items in {units} units to review "
        f"in {seconds:,.1f} s = {len(skus) / seconds:,.1f} items/s"
    )
    return seconds


def free_redis_database(server: str) -> str:
    """A Redis database of the server's 16 that holds no key, from the last one down."""
    parts = urlsplit(server)
    for number in range(15, 0, -1):
        url = urlunsplit((parts.scheme, parts.netloc, f"/{number}", parts.query, ""))
        if redis.Redis.from_url(url).dbsize() == 0:
            return url
    raise redis.RedisError(f"every database of {server} holds keys")


@contextmanager
def processes() -> Iterator[list[subprocess.Popen]]:
    """The processes `start` adds to the list, stopped on the way out whatever happens."""
    started: list[subprocess.Popen] = []
    try:
        yield started
    finally:
        for process in started:
            stop(process)


def emulator(bench: Bench, started: list[subprocess.Popen]) -> str:
    """The self-hosted model server's emulator on a free port: its base URL."""
    args = ["run_emulator", "--protocol", "openai_compatible", "--port", "0"]
    process = start(
        started, [*args, "--per-request-ms", str(bench.server_answer_ms)], bench.env, stdout=subprocess.PIPE
    )
    announced = process.stdout.readline()
    url = next((word for word in announced.split() if word.startswith("http://")), None)
    if url is None:
        raise CommandFailed(f"the emulator did not say where it serves: {announced!r}")
    return url


def start(started: list[subprocess.Popen], args: list[str], env: dict[str, str], **popen) -> subprocess.Popen:
    """`manage.py args…` in a process group of its own, added to `started`. A stop (Ctrl-C,
    SIGTERM) that arrives meanwhile is held back until it is on the list (see launch.py)."""
    popen.setdefault("stdout", subprocess.DEVNULL)
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        started.append(
            subprocess.Popen(
                [sys.executable, str(MANAGE), *args],
                env=env,
                cwd=MANAGE.parent,
                start_new_session=True,
                stderr=subprocess.DEVNULL,
                text=True,
                preexec_fn=accept_stops,
                **popen,
            )
        )
    finally:
        accept_stops()
    return started[-1]


def stop(process: subprocess.Popen) -> None:
    """SIGKILL the process group: a cluster and every worker it forked, mid-task or not (the
    ledger is built for it)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def wait_for(condition, *, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise CommandFailed(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)
