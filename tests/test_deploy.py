"""Running as deployed (SPEC §4): behind TLS with BATCHDESK_HTTPS=1, and `make serve`."""

import os
import re
import runpy
import secrets
import signal
import socket
import subprocess
import sys

import httpx
import pytest

from tests.processes import ROOT, free_port, wait_until

# A real-looking key: long and random, as `check --deploy` wants.
PRODUCTION_KEY = secrets.token_urlsafe(50)

# What the test process has that a production server would not.
NOT_IN_PRODUCTION = {"DEBUG", "BATCHDESK_HTTPS", "DJANGO_SETTINGS_MODULE", "DJANGO_ALLOW_ASYNC_UNSAFE"}

HTTPS_SETTINGS = [
    "SECURE_PROXY_SSL_HEADER",
    "SECURE_SSL_REDIRECT",
    "SECURE_REDIRECT_EXEMPT",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
]


def production_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in NOT_IN_PRODUCTION}
    return {
        **env,
        "DJANGO_SETTINGS_MODULE": "batchdesk.settings",
        "DEBUG": "0",
        "SECRET_KEY": PRODUCTION_KEY,
        "ALLOWED_HOSTS": "batchdesk.example.com",
        **extra,
    }


def check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_is_clean_behind_tls():
    result = check_deploy(production_env(BATCHDESK_HTTPS="1"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_deploy_warns_when_production_lets_notices_reach_inside_the_network():
    """Issue 28, point 3: a notify_url reached a loopback control endpoint and `check --deploy` said
    nothing. Naming a private host in BATCHDESK_NOTIFY_ALLOWED_HOSTS is allowed, and warned of."""
    result = check_deploy(production_env(BATCHDESK_HTTPS="1", BATCHDESK_NOTIFY_ALLOWED_HOSTS="localhost"))
    assert result.returncode != 0
    assert "batchdesk.W005" in result.stderr and "localhost (a loopback address)" in result.stderr
    public = check_deploy(production_env(BATCHDESK_HTTPS="1", BATCHDESK_NOTIFY_ALLOWED_HOSTS="8.8.8.8"))
    assert public.returncode == 0, public.stdout + public.stderr


def test_check_deploy_fails_without_tls_settings():
    result = check_deploy(production_env())
    assert result.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in result.stderr


@pytest.fixture
def behind_tls(settings, monkeypatch):
    """The HTTPS settings exactly as settings.py makes them when BATCHDESK_HTTPS=1."""
    monkeypatch.setenv("BATCHDESK_HTTPS", "1")
    computed = runpy.run_path(str(ROOT / "batchdesk" / "settings.py"))
    for name in HTTPS_SETTINGS:
        setattr(settings, name, computed[name])
    settings.BATCHDESK_HTTPS = True


@pytest.mark.django_db
def test_plain_http_is_redirected_to_https_but_the_health_check_is_answered(client, behind_tls):
    response = client.get("/accounts/login/")
    assert response.status_code == 301
    assert response["Location"] == "https://testserver/accounts/login/"
    assert client.get("/api/health").status_code == 200


@pytest.mark.django_db
def test_through_the_proxy_pages_carry_hsts_and_secure_cookies(client, behind_tls):
    response = client.get("/accounts/login/", headers={"X-Forwarded-Proto": "https"})
    assert response.status_code == 200
    assert response["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"
    assert response.cookies["csrftoken"]["secure"] is True


# --- make serve ----------------------------------------------------------------------------


def test_make_serve_runs_granian_and_serves_the_static_files_itself(tmp_path):
    port = free_port()
    env = production_env(
        # A database of its own: `make serve` migrates it, as on a fresh machine.
        DATABASE_URL=f"sqlite:///{tmp_path / 'serve.sqlite3'}",
        ALLOWED_HOSTS="127.0.0.1",
        PORT=str(port),
        WEB_CONCURRENCY="1",
    )
    log = tmp_path / "serve.log"
    with log.open("w") as output:
        # `-o`: the virtualenv this test runs in is the one to use; make does not reinstall it.
        server = subprocess.Popen(
            ["make", "--no-print-directory", "-o", ".venv/bin/python", "serve"],
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def login_page() -> httpx.Response | None:
            assert server.poll() is None, log.read_text()
            try:
                return httpx.get(f"{base}/accounts/login/", timeout=5)
            except httpx.TransportError:
                return None

        page = wait_until(login_page, timeout=120, what="make serve to answer")
        assert page.status_code == 200
        assert page.headers["server"] == "granian"
        assert "Log in" in page.text
        # Collected, with a content hash in the name, served by WhiteNoise and cacheable for ever.
        script = re.search(r'<script src="(/static/vendor/htmx-2\.0\.8\.min\.[0-9a-f]{12}\.js)"', page.text)
        assert script, page.text
        static = httpx.get(base + script.group(1), headers={"Accept-Encoding": "gzip"}, timeout=5)
        assert static.status_code == 200
        assert "immutable" in static.headers["cache-control"]
        assert static.headers["content-encoding"] == "gzip"
        assert "htmx" in static.text
        # Only on the loopback address unless BIND_ADDRESS says otherwise.
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://{outward_address()}:{port}/api/health", timeout=2)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


# --- a production start without collectstatic (issue 18, point 7) ---------------------------


def outward_address() -> str:
    """This machine's address on its network (not the loopback one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing address
        return probe.getsockname()[0]


def web_server(env: dict[str, str], log) -> subprocess.Popen:
    """The web server as `make serve` starts it, without the steps before it."""
    return subprocess.Popen(
        [
            str(ROOT / ".venv" / "bin" / "granian"),
            "batchdesk.asgi:application",
            "--interface",
            "asginl",
            "--host",
            "127.0.0.1",
            "--port",
            env["PORT"],
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def answering(server: subprocess.Popen, url: str, log_path):
    def page() -> httpx.Response | None:
        assert server.poll() is None, log_path.read_text()
        try:
            return httpx.get(url, timeout=5)
        except httpx.TransportError:
            return None

    return wait_until(page, timeout=120, what="the web server to answer")


def uncollected_env(tmp_path, **extra: str) -> dict[str, str]:
    static_root = tmp_path / "static"  # what collectstatic would fill: left empty
    return production_env(
        ALLOWED_HOSTS="127.0.0.1",
        PORT=str(free_port()),
        BATCHDESK_STATIC_ROOT=str(static_root),
        **extra,
    )


def test_without_collectstatic_pages_render_and_link_static_files_by_their_plain_names(tmp_path):
    env = uncollected_env(tmp_path, DATABASE_URL=f"sqlite:///{tmp_path / 'serve.sqlite3'}")
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=300,
    )
    log_path = tmp_path / "web.log"
    base = f"http://127.0.0.1:{env['PORT']}"
    with log_path.open("w") as log:
        server = web_server(env, log)
    try:
        page = answering(server, f"{base}/accounts/login/", log_path)
        assert page.status_code == 200, page.text
        assert "Log in" in page.text
        assert not (tmp_path / "static" / "staticfiles.json").exists()
        # Linked by their plain names, and served from the application's own static folder.
        assert '<link rel="stylesheet" href="/static/batchdesk.css">' in page.text
        stylesheet = httpx.get(f"{base}/static/batchdesk.css", timeout=5)
        assert stylesheet.status_code == 200
        assert stylesheet.headers["content-type"].startswith("text/css")
        assert stylesheet.content == (ROOT / "static" / "batchdesk.css").read_bytes()
        script = httpx.get(f"{base}/static/vendor/htmx-2.0.8.min.js", timeout=5)
        assert script.status_code == 200 and "htmx" in script.text
        # A missing page is the application's own, in its layout.
        missing = httpx.get(f"{base}/no-such-page/", timeout=5)
        assert missing.status_code == 404
        assert "<title>Not found · BatchDesk</title>" in missing.text
        assert '<a class="brand" href="/">BatchDesk</a>' in missing.text
        assert "/no-such-page/" in missing.text
        # The missing step is named in the log.
        assert "Run `python manage.py collectstatic`" in log_path.read_text()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_a_fault_answers_the_applications_500_page_even_without_a_database(tmp_path):
    # A database server that is up, and a database on it that does not exist: every query fails.
    env = uncollected_env(tmp_path, DATABASE_URL="postgres://127.0.0.1:5432/batchdesk_no_such_database")
    log_path = tmp_path / "web.log"
    base = f"http://127.0.0.1:{env['PORT']}"
    with log_path.open("w") as log:
        server = web_server(env, log)
    try:
        answering(server, f"{base}/accounts/login/", log_path)
        # A session cookie makes the request ask the database who is signed in.
        # (The web tier waits BATCHDESK_DB_POOL_TIMEOUT, 5 s, for a connection its pool cannot open.)
        page = httpx.get(f"{base}/jobs/", cookies={"sessionid": "x" * 32}, timeout=30)
        assert page.status_code == 500
        assert "<title>Something went wrong · BatchDesk</title>" in page.text
        assert '<link rel="stylesheet" href="/static/batchdesk.css">' in page.text
        assert "Something went wrong on our side" in page.text
        assert "batchdesk_no_such_database" not in page.text
        assert "OperationalError" in log_path.read_text()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
