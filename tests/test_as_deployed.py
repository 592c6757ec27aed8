"""BatchDesk started the way the README deploys it, on a database that only `migrate` has touched:
README commands only (migrate, createsuperuser, import_catalogue, create_job, run_emulator, qcluster),
no test fixture, no project helper, no serialized test database. SPEC rule 14."""

import os
import subprocess
import sys
import uuid

import psycopg
import pytest
from django.conf import settings

from tests.processes import ROOT, free_port, reachable, wait_until

pytestmark = pytest.mark.pipeline

CATALOGUE = """\
{"sku": "DEP-1", "title": "Halden enamel jug", "features": ["1.5 litre", "enamel"], "dimensions": {"h_cm": 21}}
{"sku": "DEP-2", "title": "Petrel desk lamp", "features": ["LED", "dimmable"], "colour": "sage"}
{"sku": "DEP-3", "title": "Norvik backpack", "capacity_l": 20}
"""


@pytest.fixture
def fresh_database():
    """A database of its own, created empty and dropped afterwards."""
    db = settings.DATABASES["default"]
    server = dict(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"] or "postgres")
    name = f"bd_deployed_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgres://{server['user']}@{server['host']}:{server['port']}/{name}", name, server
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **server) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_migrate_then_qcluster_collects_results_with_nothing_else(fresh_database, tmp_path):
    url, name, server = fresh_database
    emulator_port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "batchdesk.settings",
        "DATABASE_URL": url,
        "DEBUG": "0",
        "SECRET_KEY": f"deployed-{uuid.uuid4().hex}-not-for-production",
        "ALLOWED_HOSTS": "127.0.0.1",
        "BATCHDESK_POLL_SECONDS": "1",
        "BATCHDESK_EMULATOR_URL": f"http://127.0.0.1:{emulator_port}/v1",
        "DJANGO_SUPERUSER_PASSWORD": "Deployed-Test-4417",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("REDIS_URL", None)

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    manage("migrate", "--noinput", "-v", "0")
    catalogue = tmp_path / "catalogue.jsonl"
    catalogue.write_text(CATALOGUE)
    assert "created 3" in manage("import_catalogue", str(catalogue))
    manage("createsuperuser", "--noinput", "--username", "ops", "--email", "ops@example.com")
    job_id = int(
        manage(
            "create_job",
            "--reference",
            "DEPLOYED-1",
            "--task",
            "product_description",
            "--provider",
            "emulator",
        ).strip()
    )

    started = []
    try:
        for args in (["run_emulator", "--port", str(emulator_port)], ["qcluster"]):
            started.append(
                subprocess.Popen(
                    [sys.executable, str(ROOT / "manage.py"), *args],
                    env=env,
                    cwd=ROOT,
                    start_new_session=True,
                    stdout=subprocess.DEVNULL,
                    stderr=(tmp_path / f"{args[0]}.log").open("w"),
                )
            )
        wait_until(lambda: reachable(env["BATCHDESK_EMULATOR_URL"]), timeout=30, what="the emulator")

        def states() -> dict[str, int]:
            with psycopg.connect(dbname=name, **server) as db:
                rows = db.execute(
                    "SELECT state, count(*) FROM ledger_item WHERE job_id = %s GROUP BY state", [job_id]
                )
                return dict(rows.fetchall())

        in_flight = {"prepared", "submitted", "submission_uncertain", "returned"}
        settled = wait_until(
            lambda: (counts := states()) and not set(counts) & in_flight and counts,
            timeout=150,
            what="the job's results to be collected by a worker started with qcluster alone",
        )
    except AssertionError:
        log = (tmp_path / "qcluster.log").read_text()[-3000:]
        raise AssertionError(f"worker log:\n{log}") from None
    finally:
        for process in started:
            try:
                os.killpg(process.pid, 9)
            except ProcessLookupError:
                pass
            process.wait()
    assert sum(settled.values()) == 3
    assert settled.get("awaiting_review", 0) >= 1, settled
