"""The time a batch emulator's units move by. A served emulator follows the wall clock
(`WallClock`); a test gives it a `TestClock` and moves it, so what a unit has become by the time
it is asked depends on the test's steps, never on how busy the machine is.

Every emulator reads the time from its `clock` alone: unit timestamps (`created`, a cancel asked
at, a file's `created_at`) and the replay of what would have happened by now (`advance`)."""

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch, as `time.time()` gives them."""
        ...


class WallClock:
    """The machine's time: a served emulator's units move as a provider's do."""

    def now(self) -> float:
        return time.time()


class TestClock:
    """A clock that stands still until the test moves it (`advance`). It starts at the wall
    clock's time, so timestamps an emulator hands out read as today's."""

    __test__ = False  # a helper for tests, not a test pytest should collect

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, *, seconds: float = 0.0, ms: float = 0.0) -> float:
        """Move the clock forward; returns the new time."""
        step = seconds + ms / 1000
        if step < 0:
            raise ValueError("a clock only moves forward")
        with self._lock:
            self._now += step
            return self._now
