"""Job creation is checked by one form (`review.job_forms.JobForm`) behind both doors: the start
screen and `POST /api/jobs` refuse the same things with the same words, and the limits live once."""

import json

import pytest
from django.test import Client
from django.urls import reverse

from ledger.models import MAX_UNIT_SIZE, Job
from review.job_forms import ApiJobForm, JobForm
from review.screen_forms import JobStartForm
from tests.api.conftest import token_for
from tests.factories import ProductFactory, UserFactory
from tests.review.test_jobs_screens import start

pytestmark = pytest.mark.django_db


def test_both_doors_use_the_one_form():
    assert issubclass(JobStartForm, JobForm) and issubclass(ApiJobForm, JobForm)


@pytest.mark.parametrize(
    "field, value",
    [
        ("unit_size", MAX_UNIT_SIZE + 1),
        ("unit_size", 0),
        ("provider", "nobody"),
        ("destination", "nowhere"),
        ("model", "m" * 129),
    ],
)
def test_the_screen_and_the_api_refuse_alike(client, field, value):
    ProductFactory()
    owner = UserFactory(roles=["catalogue_owner"])
    client.force_login(owner)
    screen = client.post(reverse("job_start"), start(step="start", reference="same", **{field: str(value)}))
    assert screen.status_code == 400
    screen_errors = screen.context["form"].errors[field]

    api = Client(headers={"Authorization": f"Bearer {token_for(owner)}"})
    body = {"reference": "same", "task": "product_description", "provider": "emulator", field: value}
    response = api.post("/api/jobs", json.dumps(body), content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"][field] == " ".join(screen_errors)
    assert not Job.objects.exists()
