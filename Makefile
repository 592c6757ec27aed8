# BatchDesk: the front door. `make demo` to try it, `make test` to prove it.
VENV := .venv
PY := $(VENV)/bin/python
TEST_DATABASE_URL ?= postgres://127.0.0.1:5432/batchdesk
# The demo's notify secret signs job events so a `notify_url` can be tried; it is no secret (its base64 says so).
# Its receivers are on this machine, which a deployment refuses unless it names them.
DEMO_ENV := DEBUG=1 BATCHDESK_POLL_SECONDS=2 BATCHDESK_FX_FILE=$(CURDIR)/sample/fx-rates.json \
	BATCHDESK_NOTIFY_SECRET=whsec_ZGVtbyBvbmx5LCBub3QgYSBzZWNyZXQ6IEJhdGNoRGVzaw== \
	BATCHDESK_NOTIFY_ALLOWED_HOSTS=localhost,127.0.0.1
# The suite runs on every core (pytest-xdist; each worker has its own test database), at most 4.
PARALLEL ?= --numprocesses=auto --maxprocesses=4

.PHONY: demo test run worker emulator lint format bench bench-quick clean

$(PY): requirements.txt
	@python=$$(scripts/find-python) && "$$python" -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	@touch $(PY)

demo: $(PY)
	$(DEMO_ENV) $(PY) manage.py migrate --verbosity 0
	$(DEMO_ENV) $(PY) manage.py collectstatic --noinput --verbosity 0
	$(DEMO_ENV) $(PY) manage.py run_demo

.PHONY: chromium
# First, so a machine without Chromium stops before anything else is installed.
chromium:
	@scripts/find-chromium >/dev/null

test: chromium $(PY)
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} BATCHDESK_CHROMIUM=$$(scripts/find-chromium) $(PY) -m pytest $(PARALLEL)
	@echo "Once more on SQLite, the embedded default: the screens and the role matrix"
	DATABASE_URL=sqlite:///:memory: $(PY) -m pytest -q $(PARALLEL) -m "not browser and not pipeline" tests/review

.PHONY: screenshots
# The README's pictures: the test renders them on every run but writes docs/screenshots/ only here.
screenshots: chromium $(PY)
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} BATCHDESK_CHROMIUM=$$(scripts/find-chromium) \
		BATCHDESK_SCREENSHOTS=1 $(PY) -m pytest -q tests/review/test_screenshots.py

run: $(PY)
	DEBUG=$${DEBUG:-1} $(PY) manage.py migrate --verbosity 0
	DEBUG=$${DEBUG:-1} $(PY) manage.py runserver 127.0.0.1:8000

.PHONY: serve
# Production: granian running the ASGI application (batchdesk/asgi.py), static files served by the
# application (WhiteNoise). The environment gives SECRET_KEY, ALLOWED_HOSTS, DATABASE_URL… (README,
# "Production set-up"); DEBUG stays off. A client sending its request slowly holds a coroutine, not a
# thread: hundreds of dripping connections leave it answering (README, "What fronts the web tier").
# It listens on 127.0.0.1 unless BIND_ADDRESS says otherwise (a proxy in front, or 0.0.0.0 in a container).
# WEB_CONCURRENCY processes, each running at most BATCHDESK_WEB_REQUESTS requests at once (more wait
# their turn without a thread) with at most BATCHDESK_WEB_DB_CONNECTIONS database connections. HTTP/1.1
# only (browsers and proxies speak it; no clear-text HTTP/2), no WebSocket (Django serves none).
serve: $(PY)
	$(PY) manage.py migrate --verbosity 0
	$(PY) manage.py collectstatic --noinput --verbosity 0
	exec $(VENV)/bin/granian batchdesk.asgi:application --interface asginl \
		--host $${BIND_ADDRESS:-127.0.0.1} --port $${PORT:-8000} --workers $${WEB_CONCURRENCY:-2} \
		--http 1 --no-ws --backpressure 2000 --http1-header-read-timeout 10000 \
		--respawn-failed-workers --workers-kill-timeout 30 --access-log

# The background workers (qcluster), in development and in production (with DEBUG=0 there).
worker: $(PY)
	DEBUG=$${DEBUG:-1} $(PY) manage.py qcluster

emulator: $(PY)
	DEBUG=$${DEBUG:-1} $(PY) manage.py run_emulator --port 8001

lint: $(PY)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(PY)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Issue 9's figures on a fresh PostgreSQL database (on DATABASE_URL's server, default 127.0.0.1:5432),
# dropped at the end, each judged against its baseline from the same run (SPEC §10: the import of
# new products against its ceiling): `make bench ARGS="--products 1200000"`. Both bench targets exit
# non-zero when a figure misses its target.
bench: $(PY)
	DEBUG=$${DEBUG:-1} $(PY) manage.py bench $(ARGS)

# Before a push that touched a hot path (README, "Before you push"): 20,000 products; the import,
# create_job, the collection (beside batchwizard 0.5) and three screens, in under two minutes.
bench-quick: $(PY)
	DEBUG=$${DEBUG:-1} $(PY) manage.py bench --quick $(ARGS)

clean:
	rm -rf var/ .pytest_cache .ruff_cache
