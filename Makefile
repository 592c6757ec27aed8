# BatchDesk: the front door. `make demo` to try it, `make test` to prove it.
VENV := .venv
PY := $(VENV)/bin/python
TEST_DATABASE_URL ?= postgres://127.0.0.1:5432/batchdesk
# The demo's notify secret signs job events so a `notify_url` can be tried; it is no secret (its base64 says so).
DEMO_ENV := DEBUG=1 BATCHDESK_POLL_SECONDS=2 BATCHDESK_FX_FILE=$(CURDIR)/sample/fx-rates.json \
	BATCHDESK_NOTIFY_SECRET=whsec_ZGVtbyBvbmx5LCBub3QgYSBzZWNyZXQ6IEJhdGNoRGVzaw==
# The suite runs on every core (pytest-xdist; each worker has its own test database), at most 4.
PARALLEL ?= --numprocesses=auto --maxprocesses=4

.PHONY: demo test run worker emulator lint format bench clean

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
# Production: gunicorn, static files served by the application (WhiteNoise). The environment gives
# SECRET_KEY, ALLOWED_HOSTS, DATABASE_URL… (README, "Production set-up"); DEBUG stays off. Each
# gunicorn has a control socket of its own (var/run/gunicorn-$PORT.ctl): two on one machine never
# take each other's (gunicorn's default is one path in $HOME); GUNICORN_CONTROL_SOCKET chooses another.
# Threaded workers (gthread): a worker tells gunicorn it is alive from its own loop while a thread
# streams a long answer (a million-item export); a sync worker streaming for more than gunicorn's
# 30 s timeout was killed mid-file.
serve: $(PY)
	$(PY) manage.py migrate --verbosity 0
	$(PY) manage.py collectstatic --noinput --verbosity 0
	@mkdir -p var/run
	exec $(VENV)/bin/gunicorn batchdesk.wsgi --bind $${BIND_ADDRESS:-0.0.0.0}:$${PORT:-8000} \
		--workers $${WEB_CONCURRENCY:-2} --worker-class gthread --threads $${GUNICORN_THREADS:-8} \
		--access-logfile - \
		--control-socket $${GUNICORN_CONTROL_SOCKET:-$(CURDIR)/var/run/gunicorn-$${PORT:-8000}.ctl}

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
# new products against its ceiling): `make bench ARGS="--products 1200000"`.
bench: $(PY)
	DEBUG=$${DEBUG:-1} $(PY) manage.py bench $(ARGS)

clean:
	rm -rf var/ .pytest_cache .ruff_cache
