"""The OpenAI and Gemini emulators post their provider's batch webhook, signed as Standard Webhooks
do, when a batch ends (reference/providers.md §8.4; issue 20 point 5): noticed on the emulator's
clock with nobody asking, at least once, tried again while the receiver fails, and twice with one
webhook-id when asked to. OpenAI's event is checked by the official SDK's `webhooks.unwrap`."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest

from ledger.emulators.clock import TestClock
from ledger.emulators.gemini import GeminiEmulator
from ledger.emulators.openai import Emulator
from ledger.notices.signed_webhooks import check_signature
from tests.processes import wait_until
from tests.providers.test_gemini_emulator import HEADERS
from tests.providers.test_gemini_emulator import create as create_gemini_batch
from tests.providers.test_openai_sdk import ENDPOINT, jsonl, request_line

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


class Receiver:
    """A webhook receiver on a port of its own: keeps every call, answers the statuses it is given
    in turn (then 200)."""

    def __init__(self, *answers: int) -> None:
        self.calls: list[tuple[bytes, dict[str, str]]] = []
        self.answers = list(answers)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.calls.append((body, {name.lower(): value for name, value in self.headers.items()}))
                self.send_response(receiver.answers.pop(0) if receiver.answers else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    running = Receiver()
    yield running
    running.close()


@pytest.fixture
def clock():
    return TestClock()


def openai_emulator(clock, receiver, **knobs) -> Emulator:
    return Emulator(
        per_request_ms=2,
        validating_ms=20,
        finalizing_ms=5,
        clock=clock,
        webhook_url=receiver.url,
        webhook_secret=SECRET,
        **knobs,
    )


def start_openai_batch(emulator: Emulator) -> str:
    with openai.OpenAI(base_url=emulator.base_url, api_key="sk-test", max_retries=0) as sdk:
        uploaded = sdk.files.create(
            file=("batch.jsonl", jsonl([request_line("a"), request_line("b")])), purpose="batch"
        )
        return sdk.batches.create(input_file_id=uploaded.id, endpoint=ENDPOINT, completion_window="24h").id


def test_openai_events_are_what_the_official_sdk_unwraps(clock, receiver):
    with openai_emulator(clock, receiver) as emulator:
        batch_id = start_openai_batch(emulator)
        clock.advance(seconds=1)  # the batch ends on the emulator's clock; nobody asks about it
        wait_until(lambda: receiver.calls, timeout=10, what="the webhook", every=0.05)

        (body, headers), *more = receiver.calls
        event = openai.OpenAI(api_key="x", webhook_secret=SECRET).webhooks.unwrap(body, headers)
        assert event.type == "batch.completed"
        assert event.data.id == batch_id
        assert check_signature(SECRET, body, headers) == headers["webhook-id"]
        assert not more
        (sent,) = emulator.stats()["webhooks"]
        assert {name: sent[name] for name in ("id", "type", "unit", "answers")} == {
            "id": headers["webhook-id"],
            "type": "batch.completed",
            "unit": batch_id,
            "answers": [200],
        }


def test_a_failing_receiver_is_tried_again_with_the_same_webhook_id(clock):
    failing = Receiver(500, 503)
    try:
        with openai_emulator(clock, failing) as emulator:
            start_openai_batch(emulator)
            clock.advance(seconds=1)
            wait_until(lambda: len(failing.calls) == 3, timeout=10, what="three attempts", every=0.05)
            wait_until(lambda: emulator.stats()["webhooks"], timeout=5, what="the record", every=0.05)
            assert emulator.stats()["webhooks"][0]["answers"] == [500, 503, 200]
            assert len({headers["webhook-id"] for _, headers in failing.calls}) == 1
    finally:
        failing.close()


def test_each_event_may_be_delivered_twice_with_one_webhook_id(clock, receiver):
    with openai_emulator(clock, receiver, webhook_deliveries=2) as emulator:
        start_openai_batch(emulator)
        clock.advance(seconds=1)
        wait_until(lambda: len(receiver.calls) == 2, timeout=10, what="two deliveries", every=0.05)
        (first, first_headers), (second, second_headers) = receiver.calls
        assert first == second and first_headers["webhook-id"] == second_headers["webhook-id"]


def test_no_webhook_url_posts_nothing(clock, receiver):
    with Emulator(per_request_ms=2, validating_ms=20, finalizing_ms=5, clock=clock) as emulator:
        start_openai_batch(emulator)
        clock.advance(seconds=1)
        assert emulator.stats()["webhooks"] == []
    assert receiver.calls == []


def test_gemini_posts_the_batch_by_its_resource_name(clock, receiver):
    with GeminiEmulator(
        per_request_ms=1, pending_ms=10, clock=clock, webhook_url=receiver.url, webhook_secret=SECRET
    ) as emulator:
        with httpx.Client(base_url=emulator.base_url, headers=HEADERS, timeout=10) as http:
            succeeded = create_gemini_batch(http, ["k1", "k2"])["name"]
            clock.advance(seconds=1)
            wait_until(lambda: receiver.calls, timeout=10, what="the webhook", every=0.05)
            cancelled = create_gemini_batch(http, ["k3"], "bd_other")["name"]
            assert http.post(f"/{cancelled}:cancel").status_code == 200
            wait_until(lambda: len(receiver.calls) == 2, timeout=10, what="the second webhook", every=0.05)

    events = []
    for body, headers in receiver.calls:
        check_signature(SECRET, body, headers)
        events.append(json.loads(body))
    assert [(event["type"], event["data"]["name"]) for event in events] == [
        ("batch.succeeded", succeeded),
        ("batch.cancelled", cancelled),
    ]


def test_webhooks_can_be_turned_on_while_the_emulator_serves(clock, receiver):
    with Emulator(per_request_ms=2, validating_ms=20, finalizing_ms=5, clock=clock) as emulator:
        root = httpx.URL(emulator.base_url).copy_with(path="/_emulator/config")
        knobs = {"webhook_url": receiver.url, "webhook_secret": SECRET}
        assert httpx.post(str(root), json=knobs, timeout=5).status_code == 200
        batch_id = start_openai_batch(emulator)
        clock.advance(seconds=1)
        wait_until(lambda: receiver.calls, timeout=10, what="the webhook", every=0.05)
        assert json.loads(receiver.calls[0][0])["data"]["id"] == batch_id


@pytest.mark.parametrize(
    "knobs",
    [
        {"webhook_url": "ftp://example.com"},
        {"webhook_secret": "whsec_not base64!"},
        {"webhook_deliveries": 0},
    ],
)
def test_bad_webhook_knobs_are_refused_by_name(clock, knobs):
    with Emulator(clock=clock) as emulator:
        root = httpx.URL(emulator.base_url).copy_with(path="/_emulator/config")
        answer = httpx.post(str(root), json=knobs, timeout=5)
        assert answer.status_code == 400
        assert next(iter(knobs)) in answer.json()["error"]["message"]
        assert emulator.config()["webhook_url"] is None
