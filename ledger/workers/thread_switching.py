"""How often Python hands the interpreter between threads during a bulk pass that overlaps reading
with writing (an import, a collection).

One thread reads and parses, busy in Python; another waits for the database, and each time the
database has taken part of a chunk or answered, it needs the interpreter to go on. The reading thread
hands it over only after Python's switch interval (5 ms by default), while the database waits: a
5,000-row statement with a busy reader beside it took a median 63 ms at 5 ms and 45 ms at 0.5 ms.
Sending a chunk's few megabytes takes many such turns: an import of 100,000 new products took
4.6-4.8 s at 0.5 ms, the database waiting for the client a third of the time, and 3.2-3.5 s at
0.1 ms (0.05 and 0.02 ms gained nothing more). The setting is the process's: a worker runs one
task at a time, and it is put back after."""

import sys
from collections.abc import Iterator
from contextlib import contextmanager

SWITCH_INTERVAL = 0.0001


@contextmanager
def quicker_thread_switches() -> Iterator[None]:
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, SWITCH_INTERVAL))
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
