"""A job's outcome exported through the API (SPEC §6 `GET /api/jobs/{id}/export`): the same rows as the
job page's buttons (tests/review/test_job_export.py), behind the API's door."""

import pytest
from django.test import Client

from ledger.models import GeneratedVersion, Item
from tests.api.conftest import ApiClient, assert_error, token_for
from tests.exported_jobs import csv_rows, jsonl_rows, streamed
from tests.factories import ItemFactory, JobFactory, UserFactory

pytestmark = pytest.mark.django_db


def api_get(user, path: str, **query):
    return ApiClient(token_for(user)).get(path, query)


def test_the_api_exports_with_a_token(owner, worked_job):
    job, items = worked_job
    response = api_get(owner, f"/api/jobs/{job.pk}/export", format="jsonl")
    rows = jsonl_rows(streamed(response))
    assert [row["item_id"] for row in rows] == [item.pk for item in items]
    response = api_get(owner, f"/api/jobs/{job.pk}/export", format="csv")
    assert len(csv_rows(streamed(response))) == len(items)


@pytest.mark.parametrize("role", ["catalogue_owner", "operator", "admin"])
def test_every_role_may_export_through_the_api(role):
    job = JobFactory()
    ItemFactory(job=job)
    response = api_get(UserFactory(roles=[role]), f"/api/jobs/{job.pk}/export", format="csv")
    assert len(csv_rows(streamed(response))) == 1


def test_the_api_refuses_without_a_token_or_a_role(client, outsider):
    job = JobFactory()
    client.force_login(outsider)  # a session authenticates nothing under /api/
    assert_error(client.get(f"/api/jobs/{job.pk}/export?format=csv"), 401, "unauthenticated")
    assert_error(api_get(outsider, f"/api/jobs/{job.pk}/export", format="csv"), 403, "forbidden")


@pytest.mark.parametrize("query", [{"format": "xlsx"}, {"format": ""}, {"format": ["csv", "jsonl"]}])
def test_the_api_refuses_an_unknown_format(owner, query):
    job = JobFactory()
    error = assert_error(api_get(owner, f"/api/jobs/{job.pk}/export", **query), 400, "invalid", {"format"})
    assert error["fields"]["format"] == "format must be csv or jsonl"


@pytest.mark.parametrize(
    "path",
    [
        "/api/jobs/987654321/export",
        f"/api/jobs/{2**63}/export",
        "/api/jobs/99999999999999999999999999999/export",
        "/api/jobs/0/export",
        "/api/jobs/-1/export",
        "/api/jobs/1.5/export",
    ],
)
def test_the_api_answers_404_for_an_unknown_job_or_a_number_that_is_no_id(owner, path):
    assert_error(api_get(owner, path, format="csv"), 404, "not_found")


def test_the_api_export_changes_nothing(owner, worked_job):
    job, items = worked_job
    before = list(Item.objects.filter(job=job).order_by("pk").values())
    versions = GeneratedVersion.objects.filter(item__job=job).count()
    streamed(api_get(owner, f"/api/jobs/{job.pk}/export", format="csv"))
    assert list(Item.objects.filter(job=job).order_by("pk").values()) == before
    assert GeneratedVersion.objects.filter(item__job=job).count() == versions


def test_a_process_streams_at_most_its_share_of_files_and_says_when_to_come_back(owner, worked_job, settings):
    """Each streamed file holds one of the web process's few pooled connections for as long as its
    client takes (found by attacking issue 28: eight exports at once left no connection to anyone)."""
    settings.BATCHDESK_EXPORTS_PER_PROCESS = 1
    job, items = worked_job
    downloading = api_get(owner, f"/api/jobs/{job.pk}/export", format="csv")
    assert downloading.status_code == 200

    busy = api_get(owner, f"/api/jobs/{job.pk}/export", format="jsonl")
    assert_error(busy, 503, "busy")
    assert busy["Retry-After"] == "30"
    screen = Client()
    screen.force_login(owner)
    assert screen.get(f"/jobs/{job.pk}/export", {"format": "csv"}).status_code == 503

    assert len(csv_rows(streamed(downloading))) == len(items)  # read to its end: closed, as a server does
    assert len(jsonl_rows(streamed(api_get(owner, f"/api/jobs/{job.pk}/export", format="jsonl")))) == len(
        items
    )
