"""The test OpenID provider's settings: everything particular to one run comes from the environment
the test starts it with (`running.py`)."""

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent

SECRET_KEY = "test-provider-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "oauth2_provider",
    "tests.oidc_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.oidc_provider.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [HERE / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
            ]
        },
    }
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["OIDC_PROVIDER_DB"]}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGIN_URL = "/accounts/login/"
# BatchDesk runs on the same host (127.0.0.1, another port): cookies do not tell ports apart.
SESSION_COOKIE_NAME = "provider_sessionid"
CSRF_COOKIE_NAME = "provider_csrftoken"

ISSUER = os.environ["OIDC_PROVIDER_ISSUER"]
# The claim the directory's groups are given in, as a company names it (Okta and Entra ID: `groups`).
GROUPS_CLAIM = os.environ.get("OIDC_PROVIDER_GROUPS_CLAIM", "groups")
OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_ISS_ENDPOINT": ISSUER,
    "OIDC_RSA_PRIVATE_KEY": os.environ["OIDC_PROVIDER_RSA_KEY"],
    "PKCE_REQUIRED": True,
    "SCOPES": {"openid": "OpenID Connect", "email": "E-mail address", "profile": "Name and groups"},
    "DEFAULT_SCOPES": ["openid"],
    "OAUTH2_VALIDATOR_CLASS": "tests.oidc_provider.directory.DirectoryValidator",
}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
