import pytest
from django.contrib.auth.models import Group
from django.db import connections

pytestmark = [pytest.mark.django_db(transaction=True, serialized_rollback=True)]

def test_a():
    c = connections["default"]
    print("A", id(c), hasattr(c, "_test_serialized_contents"), Group.objects.count())

def test_b():
    c = connections["default"]
    print("B", id(c), hasattr(c, "_test_serialized_contents"), Group.objects.count())
