import pytest


@pytest.fixture
def user(django_user_model):
    from django.contrib.auth.models import Group

    person = django_user_model.objects.create_user("owner", password="pw")
    person.groups.add(Group.objects.get(name="catalogue_owner"))
    return person
