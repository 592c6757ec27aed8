"""Runs a command and writes its peak memory to a file: `python ledger/bench/launch.py OUT argv…`.

The kernel counts into a child's peak memory the memory of the process that started it, so a
command started straight from the bench (a Django process) would never look smaller than it.
Started from this small process instead, its peak is its own give or take a few megabytes."""

import os
import signal
import subprocess
import sys
from collections.abc import Callable

STOPS = {signal.SIGINT, signal.SIGTERM}


def _accept_stops() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)


def run_child(argv: list[str], wait: Callable[[subprocess.Popen], object], **popen) -> object:
    """Starts argv and returns what `wait(process)` returns; if this process is stopped (Ctrl-C,
    SIGTERM) at any moment, the child is stopped with SIGTERM (so a launcher can stop its own
    child in turn) and reaped before the stop goes on.

    A stop that arrives while the child is being started is held back until `process` exists, so
    no child is ever left running on its own. The child itself starts accepting stops at once."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        process = subprocess.Popen(argv, preexec_fn=_accept_stops, **popen)
    except BaseException:
        _accept_stops()
        raise
    try:
        _accept_stops()  # a stop held back is delivered here, inside the try
        return wait(process)
    except BaseException:
        process.terminate()
        process.wait()
        raise


def main(out: str, argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    _, status, usage = run_child(argv, lambda process: os.wait4(process.pid, 0))
    with open(out, "w") as result:
        # ru_maxrss is in kilobytes on Linux.
        result.write(str(usage.ru_maxrss * 1024))
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    _accept_stops()  # the bench held them back while starting this process
    sys.exit(main(sys.argv[1], sys.argv[2:]))
