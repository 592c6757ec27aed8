"""`make demo` leaves nothing running however it ends, and refuses to start on a port already taken.

`manage.py run_demo` runs for real, on a scratch SQLite database and free ports; what it started is
found through /proc (its descendants and their process groups), as a person would find it with `ps`."""

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.processes import free_port, wait_until

pytestmark = pytest.mark.pipeline

ROOT = Path(__file__).resolve().parent.parent


def processes() -> dict[int, tuple[int, int, str]]:
    """pid → (parent pid, process group, state) of every process, from /proc/*/stat."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses; the fields after the last ')' may not.
        state, parent, group = text.rsplit(")", 1)[1].split()[:3]
        found[int(stat.parent.name)] = (int(parent), int(group), state)
    return found


def groups_started_by(pid: int) -> set[int]:
    """The process groups of every descendant of `pid` (its children run in sessions of their own)."""
    table = processes()
    descendants, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, (parent, _, _) in table.items() if parent in frontier} - descendants
        descendants |= frontier
    return {table[child][1] for child in descendants}


def running_in(groups: set[int]) -> list[int]:
    """Processes of those groups that still run (a zombie waiting to be reaped runs nothing)."""
    return [pid for pid, (_, group, state) in processes().items() if group in groups and state != "Z"]


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def environment(database: Path) -> dict:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "batchdesk.settings",
        "DEBUG": "1",
        "DATABASE_URL": f"sqlite:///{database}",
        "BATCHDESK_POLL_SECONDS": "2",
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture(scope="module")
def migrated(tmp_path_factory) -> Path:
    database = tmp_path_factory.mktemp("demo") / "migrated.sqlite3"
    assert manage("migrate", "--verbosity", "0", env=environment(database)).wait(timeout=120) == 0
    return database


@pytest.fixture
def demo_env(migrated, tmp_path) -> dict:
    """The demo's environment, on a copy of a migrated scratch SQLite database."""
    database = tmp_path / "demo.sqlite3"
    shutil.copyfile(migrated, database)
    return environment(database)


def manage(*args: str, env: dict, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "manage.py"), *args], env=env, cwd=ROOT, **kwargs)


@pytest.mark.parametrize("ending", [signal.SIGKILL, signal.SIGHUP], ids=["killed", "terminal closed"])
def test_a_demo_that_ends_leaves_nothing_running_and_frees_its_ports(demo_env, tmp_path, ending):
    web, emulator = free_port(), free_port()
    log = (tmp_path / "demo.log").open("w")
    demo = manage(
        "run_demo", "--port", str(web), "--emulator-port", str(emulator), env=demo_env, stdout=log, stderr=log
    )
    groups: set[int] = set()
    try:
        wait_until(lambda: answers(f"http://127.0.0.1:{web}/accounts/login/"), timeout=90, what="the demo")
        groups = groups_started_by(demo.pid)
        # The web server, the emulator and the cluster (with its forked workers), each a group.
        assert len(groups) >= 3, groups
        assert running_in(groups)

        os.kill(demo.pid, ending)  # run_demo alone: its children are in sessions of their own
        demo.wait(timeout=30)

        wait_until(lambda: not running_in(groups), timeout=10, every=0.2, what="the demo's processes to stop")
        assert port_free(web) and port_free(emulator)
    finally:
        if demo.poll() is None:
            demo.kill()
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


def test_a_taken_port_is_reported_with_the_process_holding_it_and_nothing_starts(tmp_path):
    web, emulator = free_port(), free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", emulator))
        holder.listen()
        done = subprocess.run(
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "run_demo",
                "--port",
                str(web),
                "--emulator-port",
                str(emulator),
            ],
            env=environment(tmp_path / "demo.sqlite3"),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert f"Port {emulator} is taken by pid {os.getpid()} (" in done.stderr
    assert f"Port {web} " not in done.stderr
    # The holder is this test's own process (pytest, or a pytest-xdist worker): its program is named.
    holder_program = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().split(b"\0")[0].decode()
    assert f"({holder_program} " in done.stderr, "the holder's command line is shown"
    assert done.stdout == "" and port_free(web), "nothing was loaded or started"
