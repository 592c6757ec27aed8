"""`make bench` (issue 9): it prints every figure it measures with numbers, lists the others as not
measured yet, and leaves no database behind, whether it finishes or is stopped. Its speed is the
bench's own business: nothing here is timed."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ledger.bench.database import exists, server_url
from ledger.bench.run import NOT_MEASURED_YET

ROOT = Path(__file__).resolve().parent.parent
MEASURED = (
    "import, new products",
    "import, new products: peak memory",
    "import, unchanged re-import",
    "create_job, every product",
    "create_job: peak memory",
)
NUMBER = r"[\d,.]+"

pytestmark = pytest.mark.postgresql_only


def bench_command(products: int) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "DEBUG": "1"}
    return [sys.executable, str(ROOT / "manage.py"), "bench", "--products", str(products)], env


def database_named(output: str) -> str:
    return re.search(r"Database (bd_bench_[0-9a-f]+) on", output).group(1)


def test_a_small_run_prints_every_figure_and_drops_its_database():
    argv, env = bench_command(200)
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    table = done.stdout.split("\n\n")[-1]
    for name in MEASURED:
        row = re.search(
            rf"^{re.escape(name)}\s+({NUMBER}) (rows/s|items/s|MB)\s+(.+?)\s{{2,}}(\S+)\s", table, re.M
        )
        assert row, f"{name!r} is missing from the table:\n{table}"
        assert float(row.group(1).replace(",", "")) > 0
    for name, target in NOT_MEASURED_YET:
        assert re.search(rf"^{re.escape(name)}\s+not measured yet\s.*{re.escape(target)}", table, re.M), table
    assert re.search(rf"^import, new products\s.*\s({NUMBER}) rows/s COPY\s+({NUMBER})\s", table, re.M)
    assert "200 rows in" in done.stdout and "200 items in" in done.stdout
    name = database_named(done.stdout)
    assert f"Database {name} dropped" in done.stdout
    assert not exists(server_url(os.environ.get("DATABASE_URL", "")), name)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_run_stopped_halfway_drops_its_database_and_leaves_no_process(stop):
    argv, env = bench_command(3000)
    # Its own process group, as in a terminal, where Ctrl-C reaches the bench and what it runs.
    process = subprocess.Popen(
        argv,
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        seen = []
        for line in process.stdout:
            seen.append(line)
            if line.startswith("COPY baseline"):  # the import is running now
                break
        name = database_named("".join(seen))
        assert exists(server_url(os.environ.get("DATABASE_URL", "")), name)
        os.killpg(process.pid, stop)
        process.communicate(timeout=60)
        left = subprocess.run(["ps", "-g", str(process.pid), "-o", "pid="], capture_output=True, text=True)
    finally:
        process.kill()
    assert process.returncode != 0
    assert not exists(server_url(os.environ.get("DATABASE_URL", "")), name)
    assert left.stdout.strip() == ""
