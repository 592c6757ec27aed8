"""People in each role and a draft waiting for review. Tests bring their own database marker."""

import os

import pytest
from django.db import connections

from ledger.models import GeneratedVersion, Item, Job
from tests.factories import ItemFactory, JobFactory, add_version


@pytest.fixture
def job() -> Job:
    return JobFactory()


@pytest.fixture
def draft(job) -> GeneratedVersion:
    """The latest, valid version of an item waiting for review."""
    return add_version(ItemFactory(job=job, awaiting_review=True))


@pytest.fixture
def item(draft) -> Item:
    return draft.item


# --- browser tests ------------------------------------------------------------------------

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def chromium() -> str:
    """The Chromium `make test` found (scripts/find-chromium), or Debian's; missing, every browser
    test fails with this one message rather than Playwright's."""
    path = os.environ.get("BATCHDESK_CHROMIUM") or "/usr/bin/chromium"
    if not os.access(path, os.X_OK):
        pytest.fail(
            f"No Chromium at {path}: run `make test` (it finds or installs Chromium), "
            "or set BATCHDESK_CHROMIUM to a Chromium executable.",
            pytrace=False,
        )
    return path


@pytest.fixture
def page(chromium, live_server):
    """A fresh Chromium page, started once the test database is set up and stopped before it is flushed.

    While Playwright's sync API runs, asyncio reports a running loop in this thread, and Django (through
    asgiref's Local) hands out a second set of connections: they are closed before Playwright stops, so
    the flush and the serialized rollback happen on the thread's own connection."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.set_default_timeout(5000)
        try:
            yield page
        finally:
            browser.close()
            connections.close_all()


@pytest.fixture
def apply_inline(monkeypatch):
    """Approval queues applying through django-q on commit; run it in the request instead of a worker."""
    monkeypatch.setattr("django_q.conf.Conf.SYNC", True)
