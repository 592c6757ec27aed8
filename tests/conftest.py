import httpx
import pytest

# A worked job to export, for the screens' export tests and the API's alike.
from tests.exported_jobs import pounds, worked_job  # noqa: F401


def pytest_collection_modifyitems(config, items):
    """On SQLite (`make test` runs the screens and the role matrix there too), tests of what only
    PostgreSQL does are deselected, and counted as such in the summary."""
    from django.db import connection

    if connection.vendor == "postgresql":
        return
    deselected = [item for item in items if item.get_closest_marker("postgresql_only")]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


@pytest.fixture(autouse=True)
def fresh_entered_rates():
    """Each process keeps admins' exchange rates for a few seconds (ledger.money.currency); a test's rates,
    rolled back with its transaction, must not outlive it, as Django's own caches do not."""
    from ledger.money.currency import forget_entered_rates

    forget_entered_rates()
    yield
    forget_entered_rates()


@pytest.fixture
def owner():
    from tests.factories import UserFactory

    return UserFactory(roles=["catalogue_owner"])


@pytest.fixture
def operator():
    from tests.factories import UserFactory

    return UserFactory(roles=["operator"])


@pytest.fixture
def admin_person():
    from tests.factories import UserFactory

    return UserFactory(roles=["admin"])


@pytest.fixture
def outsider():
    """Signed in (or holding a token), but in none of the roles."""
    from tests.factories import UserFactory

    return UserFactory()


@pytest.fixture
def processes(settings):
    """Emulator and worker processes sharing the test database; stopped before it is flushed."""
    from tests.processes import Processes

    running = Processes()
    yield running
    running.stop_all()


@pytest.fixture
def clock():
    """The emulator's clock: it stands still until the test moves it (`clock.advance(ms=...)`)."""
    from ledger.emulators.clock import TestClock

    return TestClock()


@pytest.fixture
def emulator(clock):
    """The OpenAI Batch emulator in this process, over real HTTP, on the test's clock."""
    from ledger.emulators.openai import Emulator

    with Emulator(per_request_ms=1, validating_ms=10, finalizing_ms=5, seed=3, clock=clock) as running:
        yield running


@pytest.fixture
def provider(emulator):
    """The OpenAI adapter, talking to that emulator."""
    from ledger.providers.openai import OpenAIBatchProvider

    with httpx.Client(
        base_url=emulator.base_url, headers={"Authorization": "Bearer k"}, timeout=10
    ) as client:
        yield OpenAIBatchProvider(client=client)
