"""Python's cyclic garbage collector during a bulk pass (an import, a collection).

Such a pass makes millions of short-lived lists, dicts and strings without cycles, freed as soon as
their chunk is written. The collector, run every 700 new objects by default, looks through each
chunk held (and everything Django holds) again and again: a third of an import's reading time, a
tenth of a collection's Python time. During the pass it runs every 100,000 instead: rarely, but
still, so the cycles there are (an exception's traceback, a closed connection) do not pile up.
The setting is the process's: a worker runs one task at a time, and the setting is put back after."""

import gc
from collections.abc import Iterator
from contextlib import contextmanager

COLLECT_AFTER = 100_000


@contextmanager
def fewer_cycle_collections() -> Iterator[None]:
    threshold = gc.get_threshold()
    gc.set_threshold(max(COLLECT_AFTER, threshold[0]), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
