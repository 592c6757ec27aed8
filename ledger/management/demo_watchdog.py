"""Stops the demo's processes once `run_demo` is gone, however it went: SIGKILL included, which
no handler in `run_demo` can see.

`run_demo` starts this (`python -m ledger.management.demo_watchdog`) in a session of its own,
with a pipe as its standard input, and writes the process group of each process it starts, one
a line. The pipe ends when `run_demo` ends: after "stopped" (it stopped everything itself) there
is nothing to do; without it, every group still alive gets SIGINT, then SIGKILL. Groups, because a
worker cluster forks workers that live in its group. Standard library only: no Django here."""

import os
import signal
import sys
import time

STOPPED = "stopped"
# How long the processes get to stop on SIGINT before they are killed.
GRACE_SECONDS = 3.0


def alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_groups(groups: list[int], signum: int) -> None:
    for group in groups:
        try:
            os.killpg(group, signum)
        except ProcessLookupError:
            pass


def stop(groups: list[int], grace: float = GRACE_SECONDS) -> None:
    signal_groups(groups, signal.SIGINT)
    deadline = time.monotonic() + grace
    while any(alive(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.1)
    signal_groups([g for g in groups if alive(g)], signal.SIGKILL)


def main() -> None:
    # In a session of its own already; a terminal's Ctrl-C or hang-up is for run_demo to handle.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    groups = []
    for line in sys.stdin:
        if line.strip() == STOPPED:
            return
        groups.append(int(line))
    try:
        print("The demo is gone: stopping the processes it started.", file=sys.stderr, flush=True)
    except OSError:  # its terminal may be closed
        pass
    stop(groups)


if __name__ == "__main__":
    main()
