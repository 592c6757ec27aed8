"""`make demo`: one command that starts everything a first look at BatchDesk needs."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError

from ledger.actions.jobs import create_job
from ledger.catalogue import import_catalogue
from ledger.management.demo_watchdog import STOPPED, alive, signal_groups
from ledger.models import Job, Product
from ledger.roles import ROLES

SAMPLE = Path(settings.BASE_DIR) / "sample" / "catalogue.jsonl"


class Command(BaseCommand):
    help = "Start the emulator, a worker cluster and the web server; load the sample catalogue; start a job."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--emulator-port", type=int, default=8001)

    def handle(self, *args, **options):
        refuse_taken_ports(options["port"], options["emulator_port"])
        self.prepare_data()
        emulator_url = f"http://127.0.0.1:{options['emulator_port']}/v1"
        env = {**os.environ, "BATCHDESK_EMULATOR_URL": emulator_url}
        manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
        commands = [
            [
                *manage,
                "run_emulator",
                "--port",
                str(options["emulator_port"]),
                "--per-request-ms",
                "20",
                "--fail-rate",
                "0.04",
            ],
            [*manage, "qcluster"],
            [*manage, "runserver", f"127.0.0.1:{options['port']}", "--noreload"],
        ]
        # Stopped by a signal other than Ctrl-C (a terminal closing, `kill`): stop the same way.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        signal.signal(signal.SIGHUP, signal.default_int_handler)
        # Killed outright, this process stops nothing: the watchdog does, once its pipe ends.
        watchdog = subprocess.Popen(
            [sys.executable, "-m", "ledger.management.demo_watchdog"],
            stdin=subprocess.PIPE,
            text=True,
            cwd=settings.BASE_DIR,
            start_new_session=True,
        )
        processes = []
        try:
            for command in commands:
                # Each in a session of its own, so stopping its group reaches a cluster's forked
                # workers too, and a terminal's signals reach only this process.
                processes.append(subprocess.Popen(command, env=env, start_new_session=True))
                watchdog.stdin.write(f"{processes[-1].pid}\n")
                watchdog.stdin.flush()
            self.wait_for(emulator_url)
            self.start_first_job()
            self.stdout.write(
                self.style.SUCCESS(
                    f"\nBatchDesk runs at http://127.0.0.1:{options['port']}/  (user demo, password demo)\n"
                    "Drafts arrive in the review queue within a minute. Ctrl-C stops everything.\n"
                )
            )
            while all(p.poll() is None for p in processes):
                time.sleep(0.5)
            self.stderr.write("A demo process stopped; stopping the others.")
        except KeyboardInterrupt:
            pass
        finally:
            self.stop(processes)
            watchdog.stdin.write(f"{STOPPED}\n")
            watchdog.stdin.close()
            watchdog.wait()

    def stop(self, processes: list[subprocess.Popen]) -> None:
        """SIGINT to every group, 15 seconds to stop, then SIGKILL to whatever is left of a group
        (a process that would not stop, or a worker its cluster left behind)."""
        groups = [process.pid for process in processes]
        signal_groups(groups, signal.SIGINT)
        deadline = time.monotonic() + 15
        for process in processes:
            try:
                process.wait(timeout=max(0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        signal_groups([group for group in groups if alive(group)], signal.SIGKILL)
        for process in processes:
            process.wait()

    def prepare_data(self) -> None:
        user, created = get_user_model().objects.get_or_create(
            username="demo", defaults={"is_staff": True, "is_superuser": True}
        )
        if created:
            user.set_password("demo")
            user.save()
        user.groups.add(*Group.objects.filter(name__in=ROLES))
        if not Product.objects.exists():
            report = import_catalogue(SAMPLE)
            self.stdout.write(
                f"Sample catalogue: created {report.created}, withdrawn {report.withdrawn}, rejected {report.rejected}"
            )

    def wait_for(self, url: str) -> None:
        for _ in range(100):
            try:
                httpx.get(f"{url}/batches", headers={"Authorization": "Bearer demo"}, timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError(f"The emulator did not start at {url}")

    def start_first_job(self) -> None:
        if Job.objects.exists():
            return
        job = create_job(
            reference="demo-first-descriptions",
            owner=get_user_model().objects.get(username="demo"),
            task="product_description",
            provider="emulator",
            model="gpt-4o-mini",
            unit_size=50,
        )
        self.stdout.write(f"Started job {job.reference} with {job.items.count()} items")


def refuse_taken_ports(*ports: int) -> None:
    """Before anything starts: a port in use stops the demo, naming the process that holds it."""
    taken = [port for port in ports if in_use(port)]
    if taken:
        lines = [f"Port {port} is taken by {port_holder(port)}." for port in taken]
        lines.append("Stop it, or start the demo on other ports (run_demo --port, --emulator-port).")
        raise CommandError("\n".join(lines))


def in_use(port: int) -> bool:
    with socket.socket() as probe:
        # As the servers bind: a closed connection still waiting out TIME_WAIT does not count.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def port_holder(port: int) -> str:
    """The process listening on the TCP port, as "pid 123 (its command line)", found through
    /proc (Linux): the socket's inode in /proc/net/tcp*, then the process with it open."""
    sockets = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: listening
                sockets.add(f"socket:[{inode}]")
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) in sockets for fd in fd_dir.iterdir()):
                command = (fd_dir.parent / "cmdline").read_bytes().replace(b"\0", b" ")
                return f"pid {fd_dir.parent.name} ({command.decode(errors='replace').strip()})"
        except OSError:  # gone meanwhile, or not ours to look at
            continue
    return "a process this user cannot see (`ss -ltnp` as root names it)"
