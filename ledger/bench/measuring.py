"""Time one command in a process of its own and read that process's peak memory from the kernel
(`launch.py` reports it)."""

import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .launch import run_child

MANAGE = Path(__file__).resolve().parents[2] / "manage.py"
# Started by its path, not as `-m ledger.bench.launch`, so it runs from any folder (batchwizard runs
# in a folder of its own, where it reads its `.env`).
LAUNCHER = Path(__file__).resolve().with_name("launch.py")


class CommandFailed(Exception):
    pass


@dataclass(frozen=True)
class Run:
    seconds: float
    peak_bytes: int
    output: str

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / 1_000_000

    def per_second(self, rows: int) -> float:
        return rows / self.seconds if self.seconds > 0 else float("inf")


def run_measured(argv: list[str], *, env: dict[str, str], cwd: Path = MANAGE.parent) -> Run:
    """Runs argv in `cwd` (the project's folder unless said) to its end; raises CommandFailed with
    its output if it does not succeed. The time includes starting the launcher, a few milliseconds."""
    with tempfile.TemporaryDirectory(prefix="bd_bench_") as folder:
        peak = Path(folder) / "peak"
        output = Path(folder) / "output"
        with output.open("wb") as sink:
            started = time.perf_counter()
            returncode = run_child(
                [sys.executable, str(LAUNCHER), str(peak), *argv],
                lambda process: process.wait(),
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=cwd,
            )
            seconds = time.perf_counter() - started
        text = output.read_text(errors="replace")
        if returncode != 0:
            raise CommandFailed(f"{' '.join(argv)} exited with {returncode}:\n{text[-4000:]}")
        return Run(seconds=seconds, peak_bytes=int(peak.read_text()), output=text)


def manage(*args: str, env: dict[str, str]) -> Run:
    return run_measured([sys.executable, str(MANAGE), *args], env=env)
