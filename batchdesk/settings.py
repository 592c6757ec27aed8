"""BatchDesk settings. Everything that differs between machines comes from the environment (SPEC §4)."""

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.utils.csp import CSP

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


DEBUG = env_bool("DEBUG")
# Behind a TLS-terminating proxy (SPEC §4); the HTTPS settings further down follow from it.
BATCHDESK_HTTPS = env_bool("BATCHDESK_HTTPS")
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise RuntimeError("SECRET_KEY must be set when DEBUG is off")
    SECRET_KEY = "development-only-insecure-key"
ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "").split(",") if h.strip()]
if DEBUG and not ALLOWED_HOSTS:
    ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "batchdesk.apps.BatchDeskAdminConfig",  # Django's admin, open to the `admin` group
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "ledger",  # before django_q: its `qcluster` is ledger's (ledger/management/commands/qcluster.py)
    "django_q",
    "axes",
    "review",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    # Static files from the application itself (`make serve`): collected into STATIC_ROOT, compressed,
    # with content hashes in their names so they can be cached for ever.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # The signed-in person's time zone for every time shown (review/models.py Preferences).
    "review.middleware.PreferencesMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # A screen's form-only address opened by GET (after logging in again, say): a page, not a blank 405.
    "review.middleware.FormOnlyAddressPage",
    # An htmx request after the session expired: the browser goes to the log-in page, not htmx's swap.
    "review.middleware.HtmxLogIn",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: it turns a refused login into the "too many attempts" page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "batchdesk.urls"
WSGI_APPLICATION = "batchdesk.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "review.context_processors.collector_status",
                "review.context_processors.collection_deadlines",
            ],
        },
    },
]

VAR_DIR.mkdir(exist_ok=True)
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{VAR_DIR / 'batchdesk.sqlite3'}"),
        conn_max_age=60,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # The job page's cost aggregate spent about a second in PostgreSQL's JIT compiler and a few
    # milliseconds running; these queries are short, so compiling them never pays off.
    DATABASES["default"]["OPTIONS"] = {"options": "-c jit=off"}
# The web tier (`make serve`: granian running batchdesk/asgi.py, which sets BATCHDESK_PROCESS=web) runs
# each request in a thread of its own, so a connection kept by a thread would be one per request ever
# served. Its connections come from a pool instead: at most BATCHDESK_WEB_DB_CONNECTIONS per web
# process, handed back when a request ends; a request finding none free waits up to
# BATCHDESK_DB_POOL_TIMEOUT seconds. Workers (qcluster) are processes and keep one connection each
# (CONN_MAX_AGE). README, "Database connections", gives the sum.
BATCHDESK_WEB_DB_CONNECTIONS = int(os.environ.get("BATCHDESK_WEB_DB_CONNECTIONS", "4"))
# Seconds an answer may wait for a client that does not read it (a download nobody takes) before the
# web tier abandons it, its thread and database connection freed (batchdesk/asgi.py).
BATCHDESK_SEND_IDLE_SECONDS = float(os.environ.get("BATCHDESK_SEND_IDLE_SECONDS", "60"))
# Files (exports, receipts, the audit's CSV) one pooled web process streams at once: each holds one of
# the pool's connections for as long as its client takes; one more is answered 503
# (review/streaming.py). 0: no limit (a process without a pool, as under runserver).
BATCHDESK_EXPORTS_PER_PROCESS = 0
if (
    os.environ.get("BATCHDESK_PROCESS") == "web"
    and DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
):
    BATCHDESK_EXPORTS_PER_PROCESS = int(
        os.environ.get("BATCHDESK_EXPORTS_PER_PROCESS", str(max(1, BATCHDESK_WEB_DB_CONNECTIONS - 2)))
    )
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "min_size": 1,
        "max_size": BATCHDESK_WEB_DB_CONNECTIONS,
        "timeout": float(os.environ.get("BATCHDESK_DB_POOL_TIMEOUT", "5")),
        # An idle connection beyond the first is closed after a minute.
        "max_idle": 60,
    }
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The demo runs web server and workers against one file: wait for locks instead of failing.
    DATABASES["default"]["OPTIONS"] = {"timeout": 30, "transaction_mode": "IMMEDIATE"}
    DATABASES["default"]["CONN_MAX_AGE"] = 0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Login throttling (django-axes): after BATCHDESK_LOGIN_FAILURE_LIMIT failed logins within
# BATCHDESK_LOGIN_LOCKOUT_MINUTES, that user name is refused (from any address, so each of its
# (user name, address) pairs too) until the window has passed; an address, for any user name, only
# after BATCHDESK_LOGIN_ADDRESS_FAILURE_LIMIT (at least the other limit): one person's typing behind
# an office's shared address locks nobody else out (review/accounts.py, lockout_parameters).
# `manage.py axes_reset` lifts every lock.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    # Django's password check, for superusers only when BATCHDESK_LOCAL_LOGIN=0 (review/accounts.py).
    "review.accounts.PasswordBackend",
    # The company's OpenID Connect sign-in, when BATCHDESK_OIDC_ISSUER is set (review/company_sign_in.py).
    "review.company_sign_in.CompanySignInBackend",
]
AXES_FAILURE_LIMIT = int(os.environ.get("BATCHDESK_LOGIN_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=float(os.environ.get("BATCHDESK_LOGIN_LOCKOUT_MINUTES", "15")))
BATCHDESK_LOGIN_ADDRESS_FAILURE_LIMIT = int(os.environ.get("BATCHDESK_LOGIN_ADDRESS_FAILURE_LIMIT", "50"))
AXES_LOCKOUT_PARAMETERS = "review.accounts.lockout_parameters"
AXES_LOCKOUT_CALLABLE = "review.accounts.locked_out"
AXES_CLIENT_IP_CALLABLE = "review.accounts.client_address"
AXES_USERNAME_CALLABLE = "review.accounts.attempted_username"
# `0`: local passwords are turned off for everyone but superusers (break-glass admins), on the log-in
# page and the admin's alike; people sign in with the company's OpenID Connect provider instead.
BATCHDESK_LOCAL_LOGIN = env_bool("BATCHDESK_LOCAL_LOGIN", True)
# Company sign-in (SPEC §8, review/company_sign_in.py): OpenID Connect through mozilla-django-oidc,
# the authorization code flow with PKCE. The issuer's endpoints are discovered from its
# `/.well-known/openid-configuration` at the first sign-in, never at startup: an issuer that cannot be
# reached stops nobody's `migrate` and leaves the password log-in as it is. The client secret is read
# from here only (never stored, logged or shown). BATCHDESK_OIDC_ROLE_GROUPS is JSON, role -> the
# directory groups that give it, e.g. {"catalogue_owner": ["Catalogue"], "admin": ["IT admins"]};
# a bad one stops every process at startup (system check batchdesk.E020).
BATCHDESK_OIDC_ISSUER = os.environ.get("BATCHDESK_OIDC_ISSUER", "").strip()
BATCHDESK_OIDC_CLIENT_ID = os.environ.get("BATCHDESK_OIDC_CLIENT_ID", "").strip()
BATCHDESK_OIDC_CLIENT_SECRET = os.environ.get("BATCHDESK_OIDC_CLIENT_SECRET", "").strip()
BATCHDESK_OIDC_GROUPS_CLAIM = os.environ.get("BATCHDESK_OIDC_GROUPS_CLAIM", "").strip() or "groups"
BATCHDESK_OIDC_ROLE_GROUPS = os.environ.get("BATCHDESK_OIDC_ROLE_GROUPS", "").strip() or "{}"
# The words on the log-in page's button: "Sign in with <BATCHDESK_OIDC_NAME>".
BATCHDESK_OIDC_NAME = os.environ.get("BATCHDESK_OIDC_NAME", "").strip() or "your company account"
# What mozilla-django-oidc is told besides (the endpoints and the client come from the settings above,
# read at each sign-in). RS256 is the signature every OpenID provider must offer; the client
# authenticates to the token endpoint with HTTP Basic, which every OAuth 2 server must take.
OIDC_USE_PKCE = True
OIDC_PKCE_CODE_CHALLENGE_METHOD = "S256"
OIDC_RP_SCOPES = "openid email profile"
OIDC_RP_SIGN_ALGO = "RS256"
OIDC_TOKEN_USE_BASIC_AUTH = True
OIDC_TIMEOUT = 10
OIDC_AUTHENTICATION_CALLBACK_URL = "company_sign_in_callback"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-gb"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(os.environ.get("BATCHDESK_STATIC_ROOT") or VAR_DIR / "static")
# Filled by collectstatic; WhiteNoise warns at every start while it is missing.
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Collected files by their hashed names; a file not collected by its plain name (batchdesk/static_files.py).
    "staticfiles": {"BACKEND": "batchdesk.static_files.StaticFilesStorage"},
}
# Without collectstatic, WhiteNoise serves the files from the application's static folders too.
WHITENOISE_USE_FINDERS = True

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
# Scripts only from files this server serves: no inline <script>, no onclick=, no hx-on (htmx is told
# not to evaluate anything in base.html). Style attributes stay allowed for the progress bars' widths
# (they cannot run code); tests/review/test_csp.py keeps the templates to that.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF],
    "style-src-attr": [CSP.UNSAFE_INLINE],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
}
if BATCHDESK_HTTPS:
    # TLS ends at the proxy, which says so in X-Forwarded-Proto (and must overwrite what a client sent).
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    # The load balancer's health check comes straight to the server, over plain HTTP.
    SECURE_REDIRECT_EXEMPT = [r"^api/health$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = 365 * 24 * 3600
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    # Preloading binds every host of the whole domain to HTTPS in browsers for months: a decision for
    # the domain's owner, not for one internal application, so it is not asked for here.
    SECURE_HSTS_PRELOAD = False
    SILENCED_SYSTEM_CHECKS = ["security.W021"]

# How often open submissions are polled; a collector silent for 3 intervals is "stalled".
BATCHDESK_POLL_SECONDS = int(os.environ.get("BATCHDESK_POLL_SECONDS", "30"))
# Open units of a provider whose batch webhooks arrive (OPENAI_WEBHOOK_SECRET, GEMINI_WEBHOOK_SECRET set,
# ledger/notices/provider_hooks.py) are polled at most this often: the webhook says when one ends.
BATCHDESK_HOOKED_POLL_SECONDS = int(os.environ.get("BATCHDESK_HOOKED_POLL_SECONDS", "300"))
# Seconds before a webhook destination call counts as timed out (and is retried with the same key).
BATCHDESK_WEBHOOK_TIMEOUT = float(os.environ.get("BATCHDESK_WEBHOOK_TIMEOUT", "10"))
# How long a lost create answer is looked for at the provider before the intent may be re-sent.
BATCHDESK_UNCERTAIN_GRACE_SECONDS = float(os.environ.get("BATCHDESK_UNCERTAIN_GRACE_SECONDS", "120"))
# How long a worker holds a submission it works on; a killed worker's claim runs out after this.
BATCHDESK_LEASE_SECONDS = float(os.environ.get("BATCHDESK_LEASE_SECONDS", "300"))
# First wait before a transient failure is retried; it doubles with each further attempt.
BATCHDESK_RETRY_BASE_SECONDS = float(os.environ.get("BATCHDESK_RETRY_BASE_SECONDS", "30"))
# Result lines recorded in one transaction: a killed worker loses at most one chunk's work (and
# repeats none of it). A collection hands over to a fresh task after BATCHDESK_COLLECT_SECONDS,
# well inside the worker's timeout (Q_CLUSTER below). Collecting 5,000 lines a chunk, a worker
# peaks near 100 MB.
BATCHDESK_COLLECT_CHUNK = int(os.environ.get("BATCHDESK_COLLECT_CHUNK", "5000"))
BATCHDESK_COLLECT_SECONDS = float(os.environ.get("BATCHDESK_COLLECT_SECONDS", "120"))
# An approval without edits made within this many seconds of its draft being put before the reviewer,
# or of the reviewer's previous decision, is a quick approval on the quality page (possible
# rubber-stamping): reading a product description of 60 to 100 words takes 15 s or more.
BATCHDESK_RUBBER_STAMP_SECONDS = float(os.environ.get("BATCHDESK_RUBBER_STAMP_SECONDS", "5"))
# A reviewer's last decision can be undone for this many seconds while nothing was applied; approving
# holds the application that long (SPEC §8). 0: no undo, and approved drafts are applied at once.
BATCHDESK_UNDO_SECONDS = max(0.0, float(os.environ.get("BATCHDESK_UNDO_SECONDS", "30")))
# How long a reviewer's hold on the draft their desk shows lasts; the open card renews it while they
# are active, so an idle or closed desk lets it go within this long (SPEC §8).
BATCHDESK_CLAIM_SECONDS = max(10.0, float(os.environ.get("BATCHDESK_CLAIM_SECONDS", "120")))
# The largest answer of one request the ledger keeps (UTF-8 bytes): a larger one is recorded as that
# request's failure (`answer_too_large`), never stored. A draft is a few kilobytes; 256 KB leaves
# room for long ones while a hostile 20 MB answer cannot fill the database or a page.
BATCHDESK_MAX_ANSWER_BYTES = int(os.environ.get("BATCHDESK_MAX_ANSWER_BYTES", str(256 * 1024)))
# The largest catalogue file the import screen takes (the command reads files of any size).
BATCHDESK_IMPORT_MAX_BYTES = int(os.environ.get("BATCHDESK_IMPORT_MAX_BYTES", str(200 * 1024 * 1024)))
# A JSON file of prices laid over the built-in table of ledger/money/pricing.py (format in the README);
# a bad file stops the server and the workers at startup (system check batchdesk.E001).
BATCHDESK_PRICE_FILE = os.environ.get("BATCHDESK_PRICE_FILE", "")
# Costs are shown and budgeted in the business currency (SPEC §9), converted from the providers' US
# dollars with dated rates: BATCHDESK_FX_FILE (JSON, format in the README) and rates an admin enters.
# A bad code or file stops the server and the workers at startup (system checks batchdesk.E002, E003).
BATCHDESK_CURRENCY = os.environ.get("BATCHDESK_CURRENCY", "GBP").strip().upper()
BATCHDESK_FX_FILE = os.environ.get("BATCHDESK_FX_FILE", "")
# The business currency per hour of review, pricing the review a pilot projects (SPEC §9,
# ledger/money/labour.py); unset, review is projected in hours only. Anything but a positive amount
# stops the server and the workers at startup (system check batchdesk.E007).
BATCHDESK_REVIEW_HOURLY_RATE = os.environ.get("BATCHDESK_REVIEW_HOURLY_RATE", "").strip()
# Days an unusable draft (failed validation, rejected, obsolete, withdrawn, superseded, cancelled)
# keeps its text after it became unusable; then the retention pass erases it (SPEC §11,
# ledger/lifecycle/retention.py). Anything but a whole number of at least 1 stops the server and the workers
# at startup (system check batchdesk.E004).
BATCHDESK_RETAIN_UNUSABLE_DAYS = os.environ.get("BATCHDESK_RETAIN_UNUSABLE_DAYS", "90")

# How `openai_compatible` is sent an output schema (SPEC rule 17, ledger/drafts/schema_dialects.py):
# OpenAI's strict dialect, safe behind a LiteLLM proxy or an OpenAI-like gateway, or `as_is`, the
# whole schema without `strict`, for a server that takes all of JSON Schema (vLLM).
OPENAI_COMPATIBLE_SCHEMA = os.environ.get("OPENAI_COMPATIBLE_SCHEMA", "openai_strict")
if OPENAI_COMPATIBLE_SCHEMA not in ("openai_strict", "as_is"):
    raise RuntimeError(
        f"OPENAI_COMPATIBLE_SCHEMA is {OPENAI_COMPATIBLE_SCHEMA!r}: it must be openai_strict or as_is"
    )

# Each provider's address, the names of the environment variables its credentials are read from
# when its client is built (SPEC §4), and the model a job uses when it names none. A provider is
# offered for jobs once its `required_env` are set.
PROVIDERS = {
    "openai": {
        "base_url": os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"),
        "api_key_env": "OPENAI_API_KEY",
        "default_model": "gpt-4o-mini",
        "required_env": ["OPENAI_API_KEY"],
    },
    "anthropic": {
        "base_url": os.environ.get("ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
        "api_key_env": "ANTHROPIC_API_KEY",
        "default_model": "claude-haiku-4-5",
        "required_env": ["ANTHROPIC_API_KEY"],
        # Hosts besides the API's whose results_url is followed, with the key (a gateway).
        "results_hosts": os.environ.get("ANTHROPIC_RESULTS_HOSTS", "").split(","),
    },
    "cloudflare": {
        "base_url": os.environ.get("CLOUDFLARE_API_BASE_URL", "https://api.cloudflare.com/client/v4"),
        "api_key_env": "CLOUDFLARE_API_TOKEN",
        "default_model": "@cf/meta/llama-3.3-70b-instruct-fp8-fast",
        "account_id_env": "CLOUDFLARE_ACCOUNT_ID",
        "required_env": ["CLOUDFLARE_API_TOKEN", "CLOUDFLARE_ACCOUNT_ID"],
    },
    "gemini": {
        "base_url": os.environ.get("GEMINI_BASE_URL", "https://generativelanguage.googleapis.com/v1beta"),
        "api_key_env": "GEMINI_API_KEY",
        "default_model": "gemini-2.5-flash",
        "required_env": ["GEMINI_API_KEY"],
    },
    "openai_compatible": {
        "base_url": os.environ.get("OPENAI_COMPATIBLE_BASE_URL", ""),
        "api_key_env": "OPENAI_COMPATIBLE_API_KEY",
        "default_model": os.environ.get("OPENAI_COMPATIBLE_MODEL", "default"),
        "concurrency": int(os.environ.get("OPENAI_COMPATIBLE_CONCURRENCY", "4")),
        "schema_dialect": OPENAI_COMPATIBLE_SCHEMA,
        "required_env": ["OPENAI_COMPATIBLE_BASE_URL"],
    },
    "emulator": {
        "base_url": os.environ.get("BATCHDESK_EMULATOR_URL", "http://127.0.0.1:8001/v1"),
        "api_key_env": "BATCHDESK_EMULATOR_KEY",
        "default_model": "gpt-4o-mini",
        "required_env": [],
    },
}

REDIS_URL = os.environ.get("REDIS_URL", "")
# Worker processes of one cluster. One of them keeps the collector's round, which waits between
# its passes and holds its worker all the while: a cluster of two did all its sending, polling and
# collecting on one worker, and left a core of this two-core machine idle while that worker waited
# for the database or the provider (100,000 products end to end: 141 s with two, 117 s with three).
BATCHDESK_WORKERS = int(os.environ.get("BATCHDESK_WORKERS", "3"))
Q_CLUSTER = {
    "name": "batchdesk",
    "workers": BATCHDESK_WORKERS,
    # A cluster takes from the shared queue only as many tasks as it has workers (django-q2 takes
    # their square by default): the rest stay for the other clusters sharing the broker.
    "queue_limit": BATCHDESK_WORKERS,
    # The ledger tables are the truth; a task that outlives `timeout` is killed and the queue
    # hands it out again after `retry`, which must therefore be larger.
    "timeout": 300,
    "retry": 360,
    "max_attempts": 3,
    "catch_up": False,
    # How often a cluster looks for a new task in the database broker when it found none (Redis
    # hands one over the moment it is queued): a webhook's poll or a unit's next step waited half
    # this on average. Looking every 0.1 s instead of 0.5 s costs an idle cluster 0.8 s of CPU a
    # minute instead of 0.4 s (its processes and its database connections together), 12
    # transactions a second instead of 4.
    "poll": 0.1,
    "label": "Background work",
}
if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
else:
    Q_CLUSTER["orm"] = "default"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # What a provider or a destination said may reach a log line (an exception's text): scrubbed
    # of every configured key and token on its way out (SPEC §4).
    "formatters": {"scrubbed": {"()": "ledger.drafts.scrubbing.ScrubbingFormatter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "scrubbed"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
        # Failed and locked-out logins are warnings; the bookkeeping around them is not news.
        "axes": {"level": "WARNING"},
        # One line per emulated HTTP request drowns everything else; `run_emulator -v 2` shows them.
        "ledger.emulators": {"level": "WARNING"},
    },
}

# Job notifications (SPEC §6 `notify_url`, ledger/notices/notifications.py). Events are signed with
# BATCHDESK_NOTIFY_SECRET (`whsec_<base64>`, system check batchdesk.E005); without it no job may name a
# notify_url. A notify_url never reaches loopback, private or other inside addresses
# (ledger/notices/receivers.py) unless BATCHDESK_NOTIFY_ALLOWED_HOSTS (comma list) names its host; when
# set, it is also every host one may name (`check --deploy` warns, batchdesk.W005, when one is inside).
BATCHDESK_NOTIFY_SECRET = os.environ.get("BATCHDESK_NOTIFY_SECRET", "").strip()
BATCHDESK_NOTIFY_ALLOWED_HOSTS = [
    host.strip().lower()
    for host in os.environ.get("BATCHDESK_NOTIFY_ALLOWED_HOSTS", "").split(",")
    if host.strip()
]
# Seconds a receiver has to answer: a slow one is tried again later, it never holds a worker long.
BATCHDESK_NOTIFY_TIMEOUT = float(os.environ.get("BATCHDESK_NOTIFY_TIMEOUT", "5"))
# First wait before a failed delivery is tried again; it doubles with each attempt, up to an hour.
BATCHDESK_NOTIFY_RETRY_SECONDS = float(os.environ.get("BATCHDESK_NOTIFY_RETRY_SECONDS", "30"))
# How long one response of `GET /api/jobs/{id}/stream` lasts before the client reconnects: a stream
# holds one of the web process's request threads while it is open (never a database connection while
# it waits).
BATCHDESK_STREAM_SECONDS = float(os.environ.get("BATCHDESK_STREAM_SECONDS", "30"))
# Requests one web process runs at once, each in a thread of its own (batchdesk/asgi.py); more wait
# their turn without a thread.
BATCHDESK_WEB_REQUESTS = int(os.environ.get("BATCHDESK_WEB_REQUESTS", "32"))
# How many streams one web server process keeps open at once: a quarter of its requests, so that open
# job pages never take every request slot from everyone else. A stream asked for beyond this says the
# job once and asks the browser to come back later (`review.api.stream`).
BATCHDESK_STREAMS_PER_PROCESS = int(
    os.environ.get("BATCHDESK_STREAMS_PER_PROCESS", str(max(1, BATCHDESK_WEB_REQUESTS // 4)))
)

# Owners' e-mail (their job reaches review, needs attention or is completed) goes through Django's
# mailer, configured from the environment: the SMTP server EMAIL_HOST (a local one on port 25 when
# unset), or, with DEBUG and no EMAIL_HOST, printed by the worker instead.
email_host = os.environ.get("EMAIL_HOST", "")
if email_host or not DEBUG:
    MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {
                "host": email_host or "localhost",
                "port": int(os.environ.get("EMAIL_PORT", "25")),
                "username": os.environ.get("EMAIL_HOST_USER", ""),
                "password": os.environ.get("EMAIL_HOST_PASSWORD", ""),
                "use_tls": env_bool("EMAIL_USE_TLS"),
                "timeout": 10,
            },
        }
    }
else:
    MAILERS = {"default": {"BACKEND": "django.core.mail.backends.console.EmailBackend"}}
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "batchdesk@localhost")

# `1`: a collected unit's files stay at the provider (SPEC §11); otherwise they are deleted there
# once its results are recorded (`ledger.lifecycle.provider_files`).
BATCHDESK_KEEP_PROVIDER_FILES = os.environ.get("BATCHDESK_KEEP_PROVIDER_FILES", "") == "1"
