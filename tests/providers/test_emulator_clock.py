"""A serving emulator works on its units as time passes, asked about them or not, as a provider
does: a finished unit's results are written before anyone polls it. The emulator's clock is moved
by the test; what is waited for is the emulator's own thread (`keep_time`) doing the work."""

import json
import threading

import pytest

from ledger.emulators.clock import TestClock, WallClock
from ledger.emulators.openai import ENDPOINT, REQUESTS_AT_A_TIME, Emulator
from tests.processes import wait_until


def request(n: int) -> str:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"Title: Lamp {n}"}]}
    return json.dumps({"custom_id": f"bd-{n}-1", "method": "POST", "url": ENDPOINT, "body": body})


def test_a_unit_nobody_asks_about_is_worked_on_and_its_results_written():
    clock = TestClock()
    emulator = Emulator(per_request_ms=1, validating_ms=5, finalizing_ms=5, clock=clock)
    content = "".join(request(n) + "\n" for n in range(20)).encode()
    file = emulator.create_file(filename="in.jsonl", purpose="batch", content=content)
    batch = emulator.create_batch(
        {"input_file_id": file["id"], "endpoint": ENDPOINT, "completion_window": "24h"}
    )
    unit = emulator._batches[batch["id"]]  # read as it is: `get_batch` would bring it up to date
    clock.advance(seconds=1)  # past every step of the unit; nobody asks about it
    assert unit.status == "validating"
    stop = threading.Event()
    clock = threading.Thread(target=emulator.keep_time, args=(stop,), kwargs={"every": 0.01})
    clock.start()
    try:
        wait_until(lambda: unit.status == "completed", timeout=30, what="the unit to complete by itself")
    finally:
        stop.set()
        clock.join()
    # The same unit a poll finds: every request answered once, in its output file.
    answered = emulator.get_batch(batch["id"])
    assert answered["status"] == "completed" and answered["request_counts"]["completed"] == 20
    output = emulator._files[answered["output_file_id"]].content.decode().splitlines()
    assert sorted(json.loads(line)["custom_id"] for line in output) == sorted(f"bd-{n}-1" for n in range(20))
    assert emulator.evidence()["inferences"] == {f"bd-{n}-1": 1 for n in range(20)}


def test_time_kept_in_the_background_runs_a_few_hundred_requests_at_a_time_and_lets_go_of_the_lock():
    """An upload or a poll waits for a part of a unit's run, not for all of it (nor for every unit's);
    the unit comes out as it would have all at once."""
    clock = TestClock()
    emulator = Emulator(per_request_ms=0, validating_ms=5, finalizing_ms=5, clock=clock)
    count = REQUESTS_AT_A_TIME * 2 + 7
    content = "".join(request(n) + "\n" for n in range(count)).encode()
    file = emulator.create_file(filename="in.jsonl", purpose="batch", content=content)
    batch = emulator.create_batch(
        {"input_file_id": file["id"], "endpoint": ENDPOINT, "completion_window": "24h"}
    )
    unit = emulator._batches[batch["id"]]
    clock.advance(seconds=1)

    parts = []
    with emulator.lock:
        while emulator.advance_a_little():
            parts.append(len(emulator.evidence()["inferences"]))
    assert parts == [REQUESTS_AT_A_TIME, 2 * REQUESTS_AT_A_TIME]
    assert unit.status == "completed"
    answered = emulator.get_batch(batch["id"])
    assert answered["request_counts"] == {"total": count, "completed": count, "failed": 0}
    output = emulator._files[answered["output_file_id"]].content.decode().splitlines()
    assert sorted(json.loads(line)["custom_id"] for line in output) == sorted(
        f"bd-{n}-1" for n in range(count)
    )


def test_a_test_clock_stands_still_until_moved_and_never_goes_back():
    clock = TestClock(start=1_000.0)

    assert clock.now() == clock.now() == 1_000.0
    assert clock.advance(ms=250) == 1_000.25 and clock.advance(seconds=2) == 1_002.25
    with pytest.raises(ValueError):
        clock.advance(seconds=-1)
    assert clock.now() == 1_002.25


def test_a_served_emulator_follows_the_wall_clock_unless_given_one():
    assert isinstance(Emulator().clock, WallClock)
    clock = TestClock()
    assert Emulator(clock=clock).clock is clock
