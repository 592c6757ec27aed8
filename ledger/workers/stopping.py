"""A worker cluster asked to stop. `qcluster` (ledger/management/commands/qcluster.py) raises the
flag when it gets SIGTERM or SIGINT; every process it forks shares the flag, and a task that works
for long (the collector's round, a collection, applying, a catalogue import) looks at it between
steps, hands its claim over and ends. Outside a cluster the flag is never raised."""

import multiprocessing

# One byte of memory shared with the processes forked after this module is imported: written by
# the cluster's main process, read by its workers, without a lock (a stop must never wait for one).
STOP_FLAG = multiprocessing.RawValue("b", 0)


def ask_to_stop() -> None:
    STOP_FLAG.value = 1


def stop_asked() -> bool:
    return bool(STOP_FLAG.value)
