"""Settings for the test suite: the real settings, with test defaults for what the environment
does not say. Worker and emulator processes started by tests use this module too."""

import os

os.environ.setdefault("SECRET_KEY", "test-only-not-secret")
os.environ.setdefault("DATABASE_URL", "postgres://127.0.0.1:5432/batchdesk")
os.environ.setdefault("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver")
# Playwright's sync API runs an event loop in the test thread; the ORM calls the tests make
# from that thread are ordinary synchronous ones.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
# Approved drafts are applied at once unless a test asks for the undo window (tests/review/test_undo.py
# and the deployed flows that set it): most tests approve and then apply in the same breath.
os.environ.setdefault("BATCHDESK_UNDO_SECONDS", "0")

from .settings import *  # noqa: E402, F403

# Hashing test passwords the production way would dominate the suite's run time.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Static files by their plain names: the suite does not run collectstatic (tests/test_deploy.py does,
# for the production set-up).
STORAGES = {**STORAGES, "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}  # noqa: F405
