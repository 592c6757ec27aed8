"""People in each role and a draft waiting for review. Tests bring their own database marker."""

import pytest

from ledger.models import GeneratedVersion, Item, Job
from tests.factories import ItemFactory, JobFactory, UserFactory, add_version


@pytest.fixture
def owner():
    return UserFactory(roles=["catalogue_owner"])


@pytest.fixture
def operator():
    return UserFactory(roles=["operator"])


@pytest.fixture
def outsider():
    """Logged in, but in none of the roles."""
    return UserFactory()


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
