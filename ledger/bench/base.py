"""What a figure module is given (`Bench`) and what it gives back (`Figure`: one row of the table)."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .measuring import Run, manage


@dataclass(frozen=True)
class Bench:
    products: int
    catalogue: Path
    database_url: str
    # The environment every measured process runs in: DATABASE_URL names the bench's database.
    env: dict[str, str]
    # Peak memory of a Django process that only starts and connects: what "flat" is measured from.
    idle: Run
    say: Callable[[str], None]
    # How long the self-hosted server of the two-cluster figure takes to answer one request.
    server_answer_ms: int
    # `make bench-quick`: of the screens, only `screens.QUICK_SCREENS`.
    quick: bool = False

    def manage(self, *args: str) -> Run:
        return manage(*args, env=self.env)


@dataclass(frozen=True)
class Figure:
    name: str
    value: str
    baseline: str
    ratio: float | None
    target: str
    passed: bool | None  # None: nothing to judge it by in this run


# A command's own work is its run less an idle Django start (`Bench.idle`, its connection included).
# Shorter than this share of that start, the difference is the machine's noise as much as the work
# (a busy machine's two starts can differ by more): the figure is shown, not judged.
SHORTEST_JUDGED_SHARE = 0.25


def work_seconds(run: Run, idle_seconds: float) -> tuple[float, bool]:
    """(the seconds of a command's own work, whether they are long enough to judge it by)."""
    work = run.seconds - idle_seconds
    return max(work, 1e-6), work >= SHORTEST_JUDGED_SHARE * idle_seconds


def verdict(passed: bool, judged: bool) -> bool | None:
    return passed if judged else None


TOO_SHORT = " (too short to judge)"


# A process may grow this far above an idle Django process and still count as flat: one size
# cannot show growth, so the bound is set well under what holding every row would take.
FLAT_ALLOWANCE_BYTES = 100_000_000


def memory_figure(name: str, run: Run, bench: Bench) -> Figure:
    return Figure(
        name=f"{name}: peak memory",
        value=f"{run.peak_mb:,.0f} MB",
        baseline=f"{bench.idle.peak_mb:,.0f} MB idle",
        ratio=run.peak_bytes / bench.idle.peak_bytes,
        target=f"flat: ≤ idle + {FLAT_ALLOWANCE_BYTES // 1_000_000} MB",
        passed=run.peak_bytes <= bench.idle.peak_bytes + FLAT_ALLOWANCE_BYTES,
    )


def described(run: Run, rows: int, unit: str) -> str:
    return f"{rows:,} {unit} in {run.seconds:,.2f} s = {run.per_second(rows):,.0f} {unit}/s, peak {run.peak_mb:,.0f} MB"
