import pytest


@pytest.fixture
def user(django_user_model):
    from django.contrib.auth.models import Group

    person = django_user_model.objects.create_user("owner", password="pw")
    person.groups.add(Group.objects.get(name="catalogue_owner"))
    return person


@pytest.fixture
def processes(settings):
    """Emulator and worker processes sharing the test database; stopped before it is flushed."""
    from tests.processes import Processes

    running = Processes()
    yield running
    running.stop_all()
