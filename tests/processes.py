"""Real processes for the tests that need them: the emulator and django-q2 worker clusters,
sharing the test database with the test itself."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from django.db import connection

from ledger.actions.products import record_product
from tests.provider_emulators import BY_NAME, ProviderUnderTest

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, *, timeout: float, what: str, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Processes:
    """Starts manage.py commands in their own process groups; stops every one at the end."""

    def __init__(self, **env: str):
        db = connection.settings_dict
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "batchdesk.test_settings",
            "DATABASE_URL": f"postgres://{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
            "BATCHDESK_POLL_SECONDS": "1",
            "BATCHDESK_RETRY_BASE_SECONDS": "1",
            "BATCHDESK_LEASE_SECONDS": "4",
            "BATCHDESK_UNCERTAIN_GRACE_SECONDS": "3",
            "BATCHDESK_WEBHOOK_TIMEOUT": "2",
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        self.started: list[subprocess.Popen] = []

    def start(self, *args: str, stdout=None, **env: str) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args],
            env={**self.env, **env},
            cwd=ROOT,
            start_new_session=True,
            stdout=stdout,
            text=stdout is not None,
        )
        self.started.append(process)
        return process

    def emulator(self, *flags: str, provider: ProviderUnderTest = BY_NAME["emulator"]) -> str:
        """`run_emulator` of the provider's protocol; what is started next is pointed at it the way
        a deployment is: the provider's base URL and credentials in the environment."""
        # Port 0: the emulator binds a free port itself and says which (no port picked here can be
        # taken by someone else before it binds).
        process = self.start(
            "run_emulator", "--protocol", provider.protocol, "--port", "0", *flags, stdout=subprocess.PIPE
        )
        announced = process.stdout.readline()
        url = next((word for word in announced.split() if word.startswith("http://")), None)
        assert url, f"the emulator did not say where it serves: {announced!r}"
        wait_until(lambda: reachable(url), timeout=30, what="the emulator")
        self.env.update(provider.env(url))
        return url

    def kill(self, process: subprocess.Popen) -> None:
        """SIGKILL the whole process group: the cluster and every worker it forked."""
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def stop_all(self) -> None:
        # SIGKILL, not a polite stop: a cluster would first finish a collector round that may
        # sleep for most of a minute, and the ledger is built to survive exactly this.
        for process in self.started:
            if process.poll() is None:
                self.kill(process)


def reachable(url: str) -> bool:
    try:
        httpx.get(f"{url}/batches", headers={"Authorization": "Bearer t"}, timeout=1)
    except httpx.TransportError:
        return False
    return True


def emulator_stats(url: str) -> dict:
    root = httpx.URL(url).copy_with(path="/")
    return httpx.get(str(root.join("/_emulator/stats")), timeout=5).json()


def make_catalogue(n: int, prefix: str = "KIT") -> list[str]:
    materials = ["oak", "beech", "walnut", "bamboo", "ash"]
    skus = []
    for i in range(n):
        sku = f"{prefix}-{i:05d}"
        record_product(
            sku=sku,
            title=f"{materials[i % 5].title()} serving board no. {i}",
            fields={"material": materials[i % 5], "dimensions": f"{30 + i} x 20 cm", "care": "hand wash"},
        )
        skus.append(sku)
    return skus
