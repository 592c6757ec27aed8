"""Figure (h): how long after a batch ends at the provider its results are recorded, woken by the
provider's webhook (`/hooks/openai`) against polling at the default interval (issue 20 point 5).

Both run as a deployment does, each on a database of its own that only `migrate` has touched: the
OpenAI emulator (`run_emulator`), a worker cluster with the collector passing every 30 s (the
default), and, for the webhook, the web server (`runserver`) the emulator posts its signed
`batch.completed` to, with OPENAI_WEBHOOK_SECRET set. Six jobs of one unit each are created at once;
their batches run 1 to 6 × RUN_SECONDS, so that they end at different moments of the collector's
cycle. A unit's latency runs to its `collected` event from the webhook's delivery (the emulator's
`sent_at`) or, polled, from its batch's end (the emulator's `completed_at`, in whole seconds: up to
a second long). The cluster, the server and the
emulator are stopped whatever happens."""

import contextlib
import json
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import psycopg

from .base import Bench, Figure
from .catalogue_file import write_catalogue
from .database import database_url, fresh_database, server_url
from .end_to_end import cluster, started, wait_for_first_pass
from .measuring import CommandFailed, manage

NAME = "provider webhook to results recorded"
JOBS = 6
RUN_SECONDS = 5
POLL_SECONDS = 30  # a deployment's default
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # the bench's own emulator signs with it
PATIENCE_SECONDS = 300


def measure(bench: Bench) -> list[Figure]:
    hooked = latencies(bench, webhook=True)
    polled = latencies(bench, webhook=False)
    for label, spans in (("webhook", hooked), ("polling every 30 s", polled)):
        bench.say(f"Hook latency, {label}: " + ", ".join(f"{span:,.1f} s" for span in spans))
    hooked_mean, polled_mean = sum(hooked) / len(hooked), sum(polled) / len(polled)
    return [
        Figure(
            name=NAME,
            value=f"mean {hooked_mean:,.1f} s, max {max(hooked):,.1f} s ({len(hooked)} units)",
            baseline=f"polling every {POLL_SECONDS} s: mean {polled_mean:,.1f} s, max {max(polled):,.1f} s",
            ratio=polled_mean / hooked_mean if hooked_mean else None,
            target="sooner than polling, ratio > 1",
            passed=hooked_mean < polled_mean,
        )
    ]


def latencies(bench: Bench, *, webhook: bool) -> list[float]:
    server = server_url(bench.database_url)
    with fresh_database(server) as name, tempfile.TemporaryDirectory(prefix="bd_bench_") as folder:
        url = database_url(server, name)
        env = {
            **bench.env,
            "DATABASE_URL": url,
            "BATCHDESK_POLL_SECONDS": str(POLL_SECONDS),
            "OPENAI_API_KEY": "sk-bench",
            "ALLOWED_HOSTS": "127.0.0.1",
        }
        env.pop("OPENAI_WEBHOOK_SECRET", None)
        manage("migrate", "--verbosity", "0", env=env)
        catalogue = Path(folder) / "catalogue.jsonl"
        write_catalogue(catalogue, JOBS)
        skus = [json.loads(line)["sku"] for line in catalogue.read_text().splitlines()]
        manage("import_catalogue", str(catalogue), env=env)
        manage("createsuperuser", "--noinput", "--username", "bench", "--email", "b@example.invalid", env=env)
        log = Path(folder) / "qcluster.log"
        emulator_argv = ["run_emulator", "--protocol", "openai", "--port", "0"]
        emulator_argv += ["--per-request-ms", str(RUN_SECONDS * 1000)]
        with contextlib.ExitStack() as running:
            if webhook:
                env["OPENAI_WEBHOOK_SECRET"] = SECRET
                port = free_port()
                web = ["runserver", "--noreload", "--skip-checks", f"127.0.0.1:{port}"]
                running.enter_context(
                    started(web, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                )
                emulator_argv += [
                    "--webhook-url",
                    f"http://127.0.0.1:{port}/hooks/openai",
                    "--webhook-secret",
                    SECRET,
                ]
            emulator = running.enter_context(
                started(emulator_argv, env=env, stdout=subprocess.PIPE, text=True)
            )
            announced = emulator.stdout.readline()
            base_url = next((word for word in announced.split() if word.startswith("http://")), None)
            if base_url is None:
                raise CommandFailed(f"the emulator did not say where it serves: {announced!r}")
            env["OPENAI_BASE_URL"] = base_url
            running.enter_context(cluster(env, log))
            wait_for_first_pass(url, log)
            for number in range(JOBS):
                manage(
                    *("create_job", "--reference", f"hooks-{number}", "--task", "product_description"),
                    *("--provider", "openai", "--skus", ",".join(skus[: number + 1])),
                    env=env,
                )
            collected = wait_for_collections(url, log)
            ended = ends_at_provider(base_url, collected, webhook=webhook)
    return sorted(collected[ref] - ended[ref] for ref in collected)


def wait_for_collections(url: str, log: Path) -> dict[str, float]:
    """When each unit was collected (epoch seconds), by its batch id, once all JOBS were."""
    deadline = time.monotonic() + PATIENCE_SECONDS
    with psycopg.connect(url, autocommit=True) as connection:
        while time.monotonic() < deadline:
            rows = connection.execute(
                "SELECT s.provider_ref, extract(epoch FROM min(e.at)) FROM ledger_submission s "
                "JOIN ledger_event e ON e.submission_id = s.id AND e.to_state = 'collected' "
                "GROUP BY s.provider_ref"
            ).fetchall()
            if len(rows) == JOBS:
                return {ref: float(at) for ref, at in rows}
            time.sleep(0.5)
    raise CommandFailed(
        f"hook latency: not every unit was collected within {PATIENCE_SECONDS} s; the cluster's log "
        f"ends:\n{log.read_text(errors='replace')[-3000:]}"
    )


def ends_at_provider(base_url: str, refs, *, webhook: bool) -> dict[str, float]:
    """When each unit's end was told: the webhook's delivery (the emulator's wall clock, a tenth of
    a second at most after the end), or, polled, its batch's `completed_at`."""
    if webhook:
        stats = httpx.get(str(httpx.URL(base_url).join("/_emulator/stats")), timeout=10).json()
        return {sent["unit"]: sent["sent_at"] for sent in reversed(stats["webhooks"]) if sent["unit"] in refs}
    with httpx.Client(base_url=base_url, headers={"Authorization": "Bearer sk-bench"}, timeout=10) as client:
        return {ref: float(client.get(f"/batches/{ref}").json()["completed_at"]) for ref in refs}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
