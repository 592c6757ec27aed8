"""Runs a command and writes its peak memory to a file: `python -m ledger.bench.launch OUT argv…`.

The kernel counts into a child's peak memory the memory of the process that started it, so a
command started straight from the bench (a Django process) would never look smaller than it.
Started from this small process instead, its peak is its own give or take a few megabytes."""

import os
import signal
import subprocess
import sys


def main(out: str, argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    process = subprocess.Popen(argv)
    try:
        _, status, usage = os.wait4(process.pid, 0)
    except BaseException:
        process.kill()
        process.wait()
        raise
    with open(out, "w") as result:
        # ru_maxrss is in kilobytes on Linux.
        result.write(str(usage.ru_maxrss * 1024))
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
