import os

import pytest

os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("DATABASE_URL", "postgres://127.0.0.1:5432/batchdesk")
# Playwright's sync API runs an event loop in the test thread; Django's ORM calls made by
# live_server fixtures from that thread are fine.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture
def user(django_user_model):
    from django.contrib.auth.models import Group

    person = django_user_model.objects.create_user("owner", password="pw")
    person.groups.add(Group.objects.get(name="catalogue_owner"))
    return person
