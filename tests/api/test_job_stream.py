"""`GET /api/jobs/{id}/stream` (SPEC §6): Server-Sent Events of the job's state and counts as they
change, for a token and for a signed-in person, role-checked like `GET /api/jobs/{id}`; a reconnection
hint first, then each event with an `id:`, the job as it is now at once, a reconnecting client's
`Last-Event-ID` whatever it says; each response ends after BATCHDESK_STREAM_SECONDS. Read here by the
Django test client, and by a real HTTP client parsing the stream as EventSource does against a live
server."""

import codecs
import json
import re
import time
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import httpx
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
    """Each event of the stream as text, read as the client would, one at a time: through the
    response, as the web server iterates it (it leaves out the empty chunks of a look at the job)."""
    for chunk in response:
        yield chunk.decode()


ID_AND_DATA = re.compile(r"id: (\d+)-(\d+)\ndata: (\{[^\n]*\})\n\n")


def data_of(event: str) -> dict:
    """The job an event says, from the exact text sent: `id:`, then one `data:` line."""
    sent = ID_AND_DATA.fullmatch(event)
    assert sent, event
    return json.loads(sent.group(3))


def id_of(event: str) -> tuple[int, int]:
    """An event's `id:`: the job's newest own event, and its newest count row."""
    sent = ID_AND_DATA.fullmatch(event)
    assert sent, event
    return int(sent.group(1)), int(sent.group(2))


def test_the_stream_says_the_job_now_and_again_when_it_changes(as_owner):
    item = ItemFactory(state=ItemState.SUBMITTED)
    job = item.job
    response = as_owner.get(f"/api/jobs/{job.pk}/stream")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache"
    stream = events(response)

    assert next(stream) == "retry: 1000\n\n"
    event = next(stream)
    first = data_of(event)
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
    event_changed = next(stream)
    changed = data_of(event_changed)
    assert changed["counts"] == {ItemState.AWAITING_REVIEW: 1}
    assert changed["state"] == JobState.IN_REVIEW
    # Where the job was: its newest own event (its state changed) and count row (its counts did).
    (event_then, count_then), (event_now, count_now) = id_of(event), id_of(event_changed)
    assert event_now > event_then and count_now > count_then
    # Nothing changes after that: the response ends by itself, and EventSource reconnects.
    assert [event for event in stream if event.startswith("data:")] == []
    response.close()


def test_a_quiet_stream_sends_a_comment_now_and_then(as_owner, monkeypatch):
    monkeypatch.setattr(job_stream, "HEARTBEAT_SECONDS", 0)
    job = JobFactory()
    stream = events(as_owner.get(f"/api/jobs/{job.pk}/stream"))
    assert next(stream).startswith("retry:")
    assert next(stream).startswith("id:")
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
    # The job's row with its newest own event, and the sum of its few tally rows with the newest.
    with django_assert_num_queries(2):
        snapshot = job_stream.job_snapshot(job.pk)
    assert snapshot.data["items"] == 9


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


# --- a real client: HTTP over a socket, the stream parsed as EventSource parses it -------------------


class Retry(NamedTuple):
    milliseconds: int


class Message(NamedTuple):
    last_event_id: str
    data: str
    type: str = "message"


class Comment(NamedTuple):
    text: str


def lines_of(chunks: Iterable[bytes]) -> Iterator[str]:
    """An event stream's lines (HTML standard, "Interpreting an event stream"): UTF-8 (a leading BOM
    dropped), each ended by CRLF, by LF or by CR, however the chunks cut them; what follows the last
    line's end is discarded."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    pending, started = "", False
    for chunk in chunks:
        text = pending + decoder.decode(chunk)
        if not started and text:
            text, started = text.removeprefix("\ufeff"), True
        # A CR at the end may be the first half of a CRLF: kept until the next chunk says.
        held = "\r" if text.endswith("\r") else ""
        *ended, pending = re.split(r"\r\n|\r|\n", text.removesuffix("\r") if held else text)
        pending += held
        yield from ended
    if pending.endswith("\r"):
        yield pending.removesuffix("\r")


def events_of(lines: Iterable[str]) -> Iterator[Retry | Message | Comment]:
    """What an EventSource makes of the lines, in order: each `retry:` it takes, each event it
    dispatches (with the last event ID as it stands then), each comment."""
    data: list[str] = []
    kind = id_buffer = ""
    for line in lines:
        if not line:
            if data:
                yield Message(id_buffer, "\n".join(data), kind or "message")
            data, kind = [], ""
        elif line.startswith(":"):
            yield Comment(line[1:].removeprefix(" "))
        else:
            field, colon, value = line.partition(":")
            value = value.removeprefix(" ") if colon else ""
            if field == "event":
                kind = value
            elif field == "data":
                data.append(value)
            elif field == "id" and "\0" not in value:
                id_buffer = value
            elif field == "retry" and re.fullmatch(r"[0-9]+", value):
                yield Retry(int(value))


def test_the_parser_reads_the_standards_own_examples():
    chunks = [b"\xef\xbb\xbfdata: YHOO\ndata: +2\r", b"\ndata: 10\r\r: test stream\n\n", b"data\nid: 7\n"]
    chunks += [b"\ndata:  two spaces\rretry: 3x\nretry: 250\n\nevent: add\ndata: 73857293\n\ndata: cut"]

    assert list(events_of(lines_of(chunks))) == [
        Message("", "YHOO\n+2\n10"),
        Comment("test stream"),
        Message("7", ""),
        Retry(250),
        Message("7", " two spaces"),
        Message("7", "73857293", "add"),
    ]


@pytest.fixture
def live_stream(live_server, settings):
    """`live_stream(job, **headers)`: the job's stream over HTTP from the live server, as a bearer
    token's client reads it: the response and what EventSource makes of it, item by item."""
    settings.BATCHDESK_STREAM_SECONDS = 3
    token = token_for(UserFactory(roles=["operator"]))
    client = httpx.Client(
        base_url=live_server.url, headers={"Authorization": f"Bearer {token}"}, timeout=httpx.Timeout(20)
    )
    opened = []

    def open_stream(job, **headers):
        response = client.send(
            client.build_request("GET", f"/api/jobs/{job.pk}/stream", headers=headers), stream=True
        )
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        read = events_of(lines_of(response.iter_bytes()))
        opened.append((response, read))
        return response, read

    yield open_stream
    # Each response read to its end (BATCHDESK_STREAM_SECONDS at most): a stream left open would hold
    # one of the process's slots for the next test.
    for response, read in opened:
        for _ in read:
            pass
        response.close()
    client.close()


def messages(read: Iterable) -> list[Message]:
    return [thing for thing in read if isinstance(thing, Message)]


@pytest.mark.django_db(transaction=True)
def test_a_real_client_reads_the_hint_first_then_the_job_with_its_id_then_each_change(live_stream):
    item = ItemFactory(state=ItemState.SUBMITTED)
    job = item.job
    _, read = live_stream(job)

    assert next(read) == Retry(1000)
    first = next(read)
    assert isinstance(first, Message) and first.type == "message"
    assert json.loads(first.data)["counts"] == {ItemState.SUBMITTED: 1}

    change_state(item.pk, to=ItemState.RETURNED)
    changed = next(thing for thing in read if isinstance(thing, Message))

    assert json.loads(changed.data)["counts"] == {ItemState.RETURNED: 1}
    assert changed.last_event_id != first.last_event_id
    ids = [tuple(int(part) for part in message.last_event_id.split("-")) for message in (first, changed)]
    assert ids[1][0] >= ids[0][0] and ids[1][1] > ids[0][1]  # its counts changed; its state did not


@pytest.mark.django_db(transaction=True)
def test_a_client_reconnecting_with_its_last_event_id_is_told_the_job_now_at_once(live_stream, monkeypatch):
    # A look an hour apart: a first event that waited for the next look would never come (the
    # client gives up after 20 s), and each response ends after its first look.
    monkeypatch.setattr(job_stream, "CHECK_SECONDS", 3600)
    item = ItemFactory(state=ItemState.SUBMITTED)
    job = item.job
    _, read = live_stream(job)
    assert next(read) == Retry(1000)
    [before] = messages(read)  # the response ends: EventSource reconnects, sending the id it has

    change_state(item.pk, to=ItemState.RETURNED)
    refresh_job_state(job.pk)
    _, read = live_stream(job, **{"Last-Event-ID": before.last_event_id})

    assert next(read) == Retry(1000)
    [now] = messages(read)
    assert json.loads(now.data)["counts"] == {ItemState.RETURNED: 1}
    assert now.last_event_id != before.last_event_id  # it can tell something changed while it was away

    # Nothing changed since, or an id that was never sent: the job now, at once, all the same.
    for last_event_id in (now.last_event_id, "not-an-id", "9" * 200):
        _, read = live_stream(job, **{"Last-Event-ID": last_event_id})
        assert list(read) == [Retry(1000), now]


@pytest.mark.django_db(transaction=True)
def test_streams_beyond_the_process_share_are_told_the_job_once_with_its_id(live_stream, settings):
    settings.BATCHDESK_STREAMS_PER_PROCESS = 1
    slot_free_by = time.monotonic() + 10  # a stream another test left open ends within its 3 s
    while not job_stream.open_streams.take():
        assert time.monotonic() < slot_free_by, "a stream of this process never ended"
        time.sleep(0.05)
    job_stream.open_streams.give_back()
    job = JobFactory()
    _, held_read = live_stream(job)
    assert next(held_read) == Retry(1000)
    kept = next(held_read)
    assert re.fullmatch(r"[0-9]+-[0-9]+", kept.last_event_id)

    busy, busy_read = live_stream(job, **{"Last-Event-ID": kept.last_event_id})

    # Come back in 5 s; meanwhile, the job as it is, with its id; then the response ends.
    assert list(busy_read) == [Retry(5000), kept]
    assert busy.is_stream_consumed
