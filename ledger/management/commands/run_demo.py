"""`make demo`: one command that starts everything a first look at BatchDesk needs."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand

from ledger.actions import create_job
from ledger.catalogue import import_catalogue
from ledger.models import Job, Product

SAMPLE = Path(settings.BASE_DIR) / "sample" / "catalogue.jsonl"
ROLES = ["catalogue_owner", "operator", "admin"]


class Command(BaseCommand):
    help = "Start the emulator, a worker cluster and the web server; load the sample catalogue; start a job."

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--emulator-port", type=int, default=8001)

    def handle(self, *args, **options):
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
        # Each in a session of its own, so stopping reaches a cluster's forked workers too.
        processes = [subprocess.Popen(command, env=env, start_new_session=True) for command in commands]
        # Stopped by a signal other than Ctrl-C (a terminal closing, `kill`): stop the same way.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        signal.signal(signal.SIGHUP, signal.default_int_handler)
        try:
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
            for process in processes:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGINT)
            for process in processes:
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
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
