"""The production web tier as `make serve` starts it (SPEC §4, issue 28 points 1 and 2): on a database
only `migrate` has touched, with DEBUG off, a worker cluster (`qcluster`) and the emulator beside it.

- Hundreds of clients dripping their headers or their bodies leave `/api/health`, the API and the
  screens answering.
- A body larger than any page takes is refused before it is read.
- A job's event stream reaches the client as it happens, an export streams.
- The deployment (`make serve` with its defaults plus one `qcluster`) never holds more than 20
  PostgreSQL connections, with readers hammering the API while the worker sends and collects."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime

import httpx
import psycopg
import pytest
from django.conf import settings
from standardwebhooks.webhooks import Webhook

from tests.processes import ROOT, free_port, reachable, wait_until

pytestmark = [pytest.mark.pipeline, pytest.mark.postgresql_only]

# SPEC §4: `make serve` plus one `qcluster`, by default.
CONNECTION_BUDGET = 20
# Generous: a starved server does not answer at all (the threaded server this replaced timed out
# on every request); a healthy one answers in milliseconds.
ANSWER_SECONDS = 5
# The catalogue, every product of which the load test's job drafts, in units of 250 (several collected
# at once, each by a worker and its two recording threads).
PRODUCTS = 2000
WEBHOOK_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


class Deployment:
    def __init__(self, url: str, name: str, server: dict, tmp_path):
        self.name, self.server, self.tmp_path = name, server, tmp_path
        self.port = free_port()
        self.emulator_port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE", "REDIS_URL"}},
            "DJANGO_SETTINGS_MODULE": "batchdesk.settings",
            "DATABASE_URL": url,
            "DEBUG": "0",
            "SECRET_KEY": f"front-door-{uuid.uuid4().hex}-{uuid.uuid4().hex}",
            "ALLOWED_HOSTS": "127.0.0.1",
            "PORT": str(self.port),
            "BATCHDESK_POLL_SECONDS": "1",
            "BATCHDESK_EMULATOR_URL": f"http://127.0.0.1:{self.emulator_port}/v1",
            "DJANGO_SUPERUSER_PASSWORD": "Front-Door-4417",
            "OPENAI_WEBHOOK_SECRET": WEBHOOK_SECRET,
            "PYTHONUNBUFFERED": "1",
        }
        self.started: list[subprocess.Popen] = []

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def start(self, name: str, command: list[str]) -> subprocess.Popen:
        process = subprocess.Popen(
            command,
            env=self.env,
            cwd=ROOT,
            start_new_session=True,
            stdout=(self.tmp_path / f"{name}.log").open("w"),
            stderr=subprocess.STDOUT,
        )
        self.started.append(process)
        return process

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text()[-4000:]

    def connections(self) -> int:
        with psycopg.connect(dbname="postgres", autocommit=True, **self.server) as admin:
            return admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                [self.name],
            ).fetchone()[0]

    def stop(self) -> None:
        for process in self.started:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for process in self.started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """`migrate`, a superuser and an API token, a catalogue, then `make serve`, `run_emulator` and
    `qcluster`, as the README deploys it."""
    db = settings.DATABASES["default"]
    server = dict(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"] or "postgres")
    name = f"bd_front_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    tmp_path = tmp_path_factory.mktemp("front_door")
    deployment = Deployment(
        f"postgres://{server['user']}@{server['host']}:{server['port']}/{name}", name, server, tmp_path
    )
    try:
        deployment.manage("migrate", "--noinput", "-v", "0")
        deployment.manage("createsuperuser", "--noinput", "--username", "ops", "--email", "ops@example.com")
        deployment.token = deployment.manage("create_api_token", "ops").split()[-1]
        catalogue = tmp_path / "catalogue.jsonl"
        catalogue.write_text(
            "".join(
                json.dumps({"sku": f"FD-{n:05d}", "title": f"Front door lamp {n}", "colour": "sage"}) + "\n"
                for n in range(1, PRODUCTS + 1)
            )
        )
        deployment.manage("import_catalogue", str(catalogue))
        # `-o`: the virtualenv this test runs in is the one to use; make does not reinstall it.
        web = deployment.start("serve", ["make", "--no-print-directory", "-o", ".venv/bin/python", "serve"])
        deployment.start(
            "emulator",
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "run_emulator",
                "--port",
                str(deployment.emulator_port),
            ],
        )

        def health() -> bool:
            assert web.poll() is None, deployment.log("serve")
            try:
                return httpx.get(f"{deployment.base}/api/health", timeout=5).status_code in (200, 503)
            except httpx.TransportError:
                return False

        wait_until(health, timeout=120, what="make serve to answer")
        wait_until(
            lambda: reachable(deployment.env["BATCHDESK_EMULATOR_URL"]), timeout=30, what="the emulator"
        )
        deployment.start("qcluster", [sys.executable, str(ROOT / "manage.py"), "qcluster"])
        yield deployment
    finally:
        deployment.stop()
        with psycopg.connect(dbname="postgres", autocommit=True, **server) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def api(deployed, method: str, path: str, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {deployed.token}", **kwargs.pop("headers", {})}
    return httpx.request(method, deployed.base + path, headers=headers, timeout=ANSWER_SECONDS, **kwargs)


def dripping(
    port: int, opening: bytes, drop: bytes, count: int
) -> tuple[list[socket.socket], threading.Event]:
    """`count` connections that send `opening`, then `drop` every 2 s, until the event is set."""
    clients = []
    for _ in range(count):
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(opening)
        clients.append(client)
    stop = threading.Event()

    def drip():
        while not stop.wait(2):
            for client in clients:
                try:
                    client.sendall(drop)
                except OSError:
                    pass

    threading.Thread(target=drip, daemon=True).start()
    return clients, stop


def test_hundreds_of_dripping_clients_leave_health_the_api_and_the_screens_answering(deployed):
    slow_headers, stop_headers = dripping(
        deployed.port, b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n", b"X-Slow: 1\r\n", 200
    )
    slow_bodies, stop_bodies = dripping(
        deployed.port,
        b"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {deployed.token}\r\nContent-Length: 5000\r\n\r\n".encode(),
        b" ",
        100,
    )
    slow_hooks, stop_hooks = dripping(
        deployed.port,
        b"POST /hooks/openai HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5000\r\n\r\n",
        b"{",
        100,
    )
    try:
        time.sleep(3)  # every dripping client has sent its opening and at least one drop
        answers = []
        for _ in range(10):
            answers.append(httpx.get(f"{deployed.base}/api/health", timeout=ANSWER_SECONDS).status_code)
            answers.append(api(deployed, "GET", "/api/jobs").status_code)
            answers.append(httpx.get(f"{deployed.base}/accounts/login/", timeout=ANSWER_SECONDS).status_code)
        assert set(answers) <= {200, 503}, answers
        assert answers.count(200) >= 20, answers
    finally:
        for clients, stop in (
            (slow_headers, stop_headers),
            (slow_bodies, stop_bodies),
            (slow_hooks, stop_hooks),
        ):
            stop.set()
            for client in clients:
                client.close()


def first_answer(port: int, request: bytes, *, wait: float = ANSWER_SECONDS) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.settimeout(wait)
        client.sendall(request)
        return client.recv(100)


def test_a_body_larger_than_its_page_takes_is_refused_before_it_is_read(deployed):
    # Any page but the import takes what Django reads of a form or JSON body (2.5 MB).
    assert first_answer(
        deployed.port, b"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5000000\r\n\r\n{"
    ).startswith(b"HTTP/1.1 413")
    # The import page takes a catalogue file, from someone signed in, up to BATCHDESK_IMPORT_MAX_BYTES.
    upload = b"POST /catalogue/import HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n%s\r\nsku"
    signed_in = b"Cookie: sessionid=x\r\n"
    assert first_answer(deployed.port, upload % (10_000_000_000, signed_in)).startswith(b"HTTP/1.1 413")
    assert first_answer(deployed.port, upload % (50_000_000, b"")).startswith(b"HTTP/1.1 413")
    with pytest.raises(TimeoutError):  # a signed-in upload of 50 MB is waited for
        first_answer(deployed.port, upload % (50_000_000, signed_in), wait=2)


def test_a_body_that_stops_coming_or_trickles_is_answered_and_let_go(deployed):
    # The web tier waits 10 s for the next part of a body.
    stopped = b'POST /hooks/openai HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{"id"'
    answers = []
    waiting = threading.Thread(target=lambda: answers.append(first_answer(deployed.port, stopped, wait=30)))
    waiting.start()
    # A byte a second never stops, but falls behind any sensible pace after the first 10 s.
    with socket.create_connection(("127.0.0.1", deployed.port)) as client:
        client.settimeout(1)
        client.sendall(b"POST /hooks/openai HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5000\r\n\r\n")
        answer = b""
        for _ in range(30):
            client.sendall(b" ")
            try:
                answer = client.recv(100)
                break
            except TimeoutError:
                continue
    assert answer.startswith(b"HTTP/1.1 408"), answer
    waiting.join(timeout=30)
    assert answers and answers[0].startswith(b"HTTP/1.1 408"), answers


def start_job(deployed, reference: str, **body) -> int:
    answer = api(
        deployed,
        "POST",
        "/api/jobs",
        json={"reference": reference, "task": "product_description", "provider": "emulator", **body},
    )
    assert answer.status_code == 202, answer.text
    return answer.json()["id"]


def test_a_job_stream_reaches_the_client_as_it_happens_and_an_export_streams(deployed):
    job = start_job(deployed, "FRONT-STREAM", skus=["FD-00001", "FD-00002"])
    headers = {"Authorization": f"Bearer {deployed.token}", "Accept": "text/event-stream"}
    # The stream lasts BATCHDESK_STREAM_SECONDS (30 s): a server that gathered it before sending would
    # say nothing within the read timeout.
    with httpx.stream(
        "GET", f"{deployed.base}/api/jobs/{job}/stream", headers=headers, timeout=ANSWER_SECONDS
    ) as stream:
        assert stream.status_code == 200
        first = next(line for line in stream.iter_lines() if line.startswith("data:"))
    assert json.loads(first.removeprefix("data:"))["id"] == job

    export = api(deployed, "GET", f"/api/jobs/{job}/export?format=jsonl")
    assert export.status_code == 200
    assert sorted(json.loads(line)["sku"] for line in export.text.splitlines()) == ["FD-00001", "FD-00002"]


def test_the_deployment_holds_at_most_twenty_connections_under_load(deployed):
    job = start_job(deployed, "FRONT-LOAD", unit_size=250)
    peak = deployed.connections()
    answers: list[int] = []
    stop = threading.Event()

    def reader(path: str):
        while not stop.is_set():
            try:
                answers.append(api(deployed, "GET", path).status_code)
            except httpx.TransportError as exc:
                answers.append(type(exc).__name__)

    paths = [f"/api/jobs/{job}", f"/api/jobs/{job}/items?page=2", "/api/jobs", "/api/health", "/metrics"]
    readers = [threading.Thread(target=reader, args=(paths[n % len(paths)],), daemon=True) for n in range(30)]
    for thread in readers:
        thread.start()

    def settled() -> bool:
        nonlocal peak
        peak = max(peak, deployed.connections())
        counts = api(deployed, "GET", f"/api/jobs/{job}").json()["counts"]
        return counts.get("awaiting_review", 0) + counts.get("validation_failed", 0) == PRODUCTS

    try:
        wait_until(settled, timeout=300, what="every item collected while readers load the API", every=0.2)
    except AssertionError:
        raise AssertionError(
            f"qcluster:\n{deployed.log('qcluster')}\nserve:\n{deployed.log('serve')}"
        ) from None
    finally:
        stop.set()
        for thread in readers:
            thread.join(timeout=30)
    print(f"\npeak PostgreSQL connections: {peak} (budget {CONNECTION_BUDGET}); {len(answers)} reads")
    assert answers and set(answers) <= {200}, sorted({str(a) for a in answers})
    assert peak <= CONNECTION_BUDGET


def test_a_signed_provider_event_sent_in_chunks_is_read_whole(deployed):
    """A webhook with Transfer-Encoding: chunked (no Content-Length), signed by the Standard Webhooks
    library itself: the web tier reads the whole body before the signature is checked."""
    body = json.dumps(
        {"id": "evt_front", "object": "event", "created_at": 1733000000, "type": "batch.completed",
         "data": {"id": "batch_nobody_knows"}}
    )  # fmt: skip
    at = datetime.now(UTC)
    signature = Webhook(WEBHOOK_SECRET).sign("wh_front_chunked", at, body)
    headers = {
        "webhook-id": "wh_front_chunked",
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
        "Content-Type": "application/json",
    }

    def chunks():
        for start in range(0, len(body), 16):
            yield body[start : start + 16].encode()

    answer = httpx.post(
        f"{deployed.base}/hooks/openai", content=chunks(), headers=headers, timeout=ANSWER_SECONDS
    )
    assert answer.status_code == 200, answer.text
    tampered = httpx.post(
        f"{deployed.base}/hooks/openai", content=body.replace("nobody", "anybody"), headers=headers,
        timeout=ANSWER_SECONDS,
    )  # fmt: skip
    assert tampered.status_code == 400
