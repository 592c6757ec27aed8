"""`GET /api/jobs/{id}/stream` (SPEC §6): Server-Sent Events of the job's state and counts as they
change, for a token and for a signed-in person, role-checked like `GET /api/jobs/{id}`; each response
ends after BATCHDESK_STREAM_SECONDS with a reconnection hint."""

import json

import pytest

from ledger.actions.core import change_state
from ledger.actions.job_states import refresh_job_state
from ledger.states import ItemState, JobState
from review.api import stream as job_stream
from tests.api.conftest import ApiClient, assert_error, token_for
from tests.factories import ItemFactory, JobFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def short_streams(settings):
    settings.BATCHDESK_STREAM_SECONDS = 3


def events(response):
    """Each event of the stream as text, read as the client would, one at a time."""
    for chunk in response.streaming_content:
        yield chunk.decode()


def data_of(event: str) -> dict:
    assert event.startswith("data: "), event
    return json.loads(event.removeprefix("data: ").strip())


def test_the_stream_says_the_job_now_and_again_when_it_changes(as_owner):
    item = ItemFactory(state=ItemState.SUBMITTED)
    job = item.job
    response = as_owner.get(f"/api/jobs/{job.pk}/stream")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache"
    stream = events(response)

    assert next(stream) == "retry: 1000\n\n"
    first = data_of(next(stream))
    assert first == {
        "id": job.pk,
        "reference": job.reference,
        "state": job.state,
        "counts": {ItemState.SUBMITTED: 1},
        "items": 1,
    }

    change_state(item.pk, to=ItemState.RETURNED)
    change_state(item.pk, to=ItemState.AWAITING_REVIEW)
    refresh_job_state(job.pk)
    changed = data_of(next(stream))
    assert changed["counts"] == {ItemState.AWAITING_REVIEW: 1}
    assert changed["state"] == JobState.IN_REVIEW
    # Nothing changes after that: the response ends by itself, and EventSource reconnects.
    assert [event for event in stream if event.startswith("data:")] == []
    response.close()


def test_a_quiet_stream_sends_a_comment_now_and_then(as_owner, monkeypatch):
    monkeypatch.setattr(job_stream, "HEARTBEAT_SECONDS", 0)
    job = JobFactory()
    stream = events(as_owner.get(f"/api/jobs/{job.pk}/stream"))
    assert next(stream).startswith("retry:")
    assert next(stream).startswith("data:")
    assert next(stream) == ": still watching\n\n"


def test_a_signed_in_person_may_follow_the_stream(client):
    job = JobFactory()
    client.force_login(UserFactory(roles=["operator"]))
    response = client.get(f"/api/jobs/{job.pk}/stream")
    assert response.status_code == 200
    stream = events(response)
    next(stream)
    assert data_of(next(stream))["id"] == job.pk
    response.close()


def test_who_may_not_follow_it(client, as_outsider, api_as):
    job = JobFactory()
    response = client.get(f"/api/jobs/{job.pk}/stream")
    assert_error(response, 401, "unauthenticated")
    assert_error(as_outsider.get(f"/api/jobs/{job.pk}/stream"), 403, "forbidden")
    # A bad token is refused, whatever the session says.
    client.force_login(UserFactory(roles=["operator"]))
    assert_error(client.get(f"/api/jobs/{job.pk}/stream", headers={"Authorization": "Bearer nope"}), 401)


def test_an_unknown_job_or_another_method(as_owner, owner):
    job = JobFactory()
    assert_error(as_owner.get(f"/api/jobs/{job.pk + 1000}/stream"), 404, "not_found")
    # An API client sends no CSRF token: it is answered as the API answers, in JSON.
    checking_csrf = ApiClient(token_for(owner), enforce_csrf_checks=True)
    response = checking_csrf.post_json(f"/api/jobs/{job.pk}/stream", {})
    assert_error(response, 405, "method_not_allowed")
    assert response["Allow"] == "GET"


def test_each_look_at_the_job_is_two_queries_however_many_items(django_assert_num_queries):
    job = JobFactory()
    for state in (ItemState.SUBMITTED, ItemState.AWAITING_REVIEW, ItemState.APPLIED):
        ItemFactory.create_batch(3, job=job, state=state)
    with django_assert_num_queries(2):  # the job's row, and the sum of its few tally rows
        snapshot = job_stream.job_snapshot(job.pk)
    assert snapshot["items"] == 9


def test_streams_beyond_the_process_share_say_the_job_once_and_come_back_later(as_owner, settings):
    """Found by attacking issue 20: under `make serve` (2 processes of 8 threads) twenty open streams
    held every thread, and `/api/health` waited until they ended. A process now keeps at most
    BATCHDESK_STREAMS_PER_PROCESS open; another is told the job as it is and to reconnect later."""
    settings.BATCHDESK_STREAMS_PER_PROCESS = 1
    job = JobFactory()
    held = as_owner.get(f"/api/jobs/{job.pk}/stream")
    held_events = events(held)
    assert next(held_events) == "retry: 1000\n\n"
    assert data_of(next(held_events))["id"] == job.pk

    busy = as_owner.get(f"/api/jobs/{job.pk}/stream")
    assert busy.status_code == 200
    busy_events = list(events(busy))
    assert busy_events[0] == "retry: 5000\n\n"
    assert [data_of(event)["id"] for event in busy_events[1:]] == [job.pk]

    list(held_events)  # the held stream ends after BATCHDESK_STREAM_SECONDS: its slot is free again
    again = as_owner.get(f"/api/jobs/{job.pk}/stream")
    assert next(events(again)) == "retry: 1000\n\n"
