"""One intent, one job (SPEC rule 15, issue 18 point 5): the start form carries a one-time token, and
the form sent again shows the job it already started. The double click and Back in a real browser are
in test_start_once_browser.py."""

import re
import threading
import uuid

import pytest
from django.db import connections
from django.test import Client
from django.urls import reverse

from ledger.models import Job
from review.models import JobStartToken
from tests.factories import ProductFactory
from tests.review.test_jobs_screens import start

pytestmark = pytest.mark.django_db


@pytest.fixture
def products():
    return [ProductFactory(sku="K-1"), ProductFactory(sku="K-2")]


def token_in(html: str) -> str:
    return re.search(r'<input type="hidden" name="start_token" value="([0-9a-f-]{36})"', html).group(1)


def test_each_new_start_form_carries_a_new_token_which_the_confirm_step_keeps(client, owner, products):
    client.force_login(owner)
    first = token_in(client.get(reverse("job_start")).content.decode())
    second = token_in(client.get(reverse("job_start")).content.decode())
    assert first != second
    confirm = client.post(reverse("job_start"), start(step="estimate", start_token=first))
    assert 'value="start"' in confirm.content.decode()
    assert token_in(confirm.content.decode()) == first


@pytest.mark.parametrize("reference", ["", "spring"])
def test_the_same_form_sent_twice_starts_one_job_and_shows_it(client, owner, products, reference):
    client.force_login(owner)
    form = start(step="start", reference=reference)
    first = client.post(reverse("job_start"), form)
    assert first.status_code == 302
    job = Job.objects.get()
    assert first.url == reverse("job_detail", args=[job.pk])

    again = client.post(reverse("job_start"), form, follow=True)
    assert again.redirect_chain == [(reverse("job_detail", args=[job.pk]), 302)]
    assert Job.objects.count() == 1
    html = " ".join(again.content.decode().split())
    assert f"This form started job {job.reference} already; nothing more was started." in html
    assert JobStartToken.objects.get().job == job


def test_a_form_sent_again_after_its_fields_were_changed_still_starts_nothing_new(client, owner, products):
    client.force_login(owner)
    form = start(step="start")
    client.post(reverse("job_start"), form)
    again = client.post(reverse("job_start"), {**form, "scope": "skus", "skus": "K-1"})
    assert again.status_code == 302
    assert Job.objects.count() == 1


def test_two_forms_start_two_jobs(client, owner, products):
    client.force_login(owner)
    assert client.post(reverse("job_start"), start(step="start")).status_code == 302
    assert client.post(reverse("job_start"), start(step="start")).status_code == 302
    assert Job.objects.count() == 2


@pytest.mark.parametrize("token", [None, "", "not-a-token"])
def test_a_start_without_a_token_starts_nothing_and_offers_a_new_one(client, owner, products, token):
    client.force_login(owner)
    form = start(step="start")
    if token is None:
        del form["start_token"]
    else:
        form["start_token"] = token
    response = client.post(reverse("job_start"), form)
    assert response.status_code == 400
    html = response.content.decode()
    assert "This form had no one-time token" in html
    uuid.UUID(token_in(html))
    assert not Job.objects.exists()
    assert not JobStartToken.objects.exists()


def test_a_refused_start_leaves_its_token_free_for_the_corrected_form(client, owner, products):
    client.force_login(owner)
    token = str(uuid.uuid4())
    refused = client.post(reverse("job_start"), start(step="start", start_token=token, unit_size="0"))
    assert refused.status_code == 400
    assert client.post(reverse("job_start"), start(step="start", start_token=token)).status_code == 302
    assert Job.objects.count() == 1


def test_only_people_who_start_jobs_can_send_the_form(client, operator, products):
    client.force_login(operator)
    assert client.post(reverse("job_start"), start(step="start")).status_code == 403
    assert not JobStartToken.objects.exists()


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
def test_two_sends_at_the_same_moment_start_one_job(owner, products):
    """Two web processes' worth of requests: the second waits on the token's unique index until the
    first has committed, then shows its job."""
    form = start(step="start")
    answers: list[int] = []
    ready = threading.Barrier(2)

    def send() -> None:
        browser = Client()
        browser.force_login(owner)
        ready.wait()
        try:
            answers.append(browser.post(reverse("job_start"), form).status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [302, 302]
    assert Job.objects.count() == 1
    assert JobStartToken.objects.get().job == Job.objects.get()
