"""Part of the collection figure: BatchDesk's collection beside batchwizard 0.5's (issue 29, point 2;
SPEC §10), the same results file from the same emulator in the same run; target ≤ 1.0×.

batchwizard (https://pypi.org/project/batchwizard/) is installed once into a venv of its own under
`var/bench/` and kept there; where pip cannot install it (no network, no such index), the figure is
skipped with pip's reason, neither passed nor failed.

What is timed, on each side, is one whole process, from its start to its end, with the batch already
ended at the provider and known to be:
- batchwizard: `batchwizard watch` with its manifest holding the batch as completed and not yet
  collected (what its own watch records on seeing it complete): Python and its imports, one
  retrieval of the batch, the results file streamed to disk and moved into place, its manifest
  marked collected.
- BatchDesk: `manage.py collect` of the unit, `ended` (the ledger has seen it complete): Python and
  Django's start, one retrieval of the batch, the results file read, every answer validated and
  recorded, every item awaiting review.
batchwizard runs first: BatchDesk deletes the provider's files once their results are recorded."""

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .base import Figure
from .measuring import MANAGE, CommandFailed, Run, run_measured

VERSION = "0.5.0"
NAME = "collection beside batchwizard 0.5"
TARGET_RATIO = 1.0
VENV = MANAGE.parent / "var" / "bench" / f"batchwizard-{VERSION}"
INSTALL_SECONDS = 600

# Run by batchwizard's own Python, so its manifest is written by its own code: the batch as its
# `watch` leaves it on seeing it complete, waiting to be collected.
SEED_MANIFEST = """
import sys
from batchwizard.config import config
from batchwizard.models import CollectionState, JobRecord, JobState
from batchwizard.store import JobStore

JobStore(config.db_file).add(
    JobRecord(
        provider="openai",
        batch_id=sys.argv[1],
        input_path="requests.jsonl",
        endpoint="/v1/chat/completions",
        state=JobState.COMPLETED,
        provider_status="completed",
        collection_state=CollectionState.PENDING,
    )
)
"""


def install(venv: Path, *, env: dict[str, str]) -> str | None:
    """batchwizard in a venv of its own at `venv`, made unless it is there already: None once it is
    ready, else why it could not be installed. pip reads its index from `env` (PIP_INDEX_URL…)."""
    ready = venv / "installed"
    if ready.exists():
        return None
    shutil.rmtree(venv, ignore_errors=True)
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(venv)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        # The project's pip installs into it: a venv without pip of its own is made in a blink.
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(venv / "bin" / "python"),
                "install",
                "--quiet",
                "--disable-pip-version-check",
                f"batchwizard=={VERSION}",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=INSTALL_SECONDS,
        )
    except (OSError, subprocess.SubprocessError) as error:
        shutil.rmtree(venv, ignore_errors=True)
        return f"batchwizard=={VERSION} could not be installed: {error}"
    if done.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        said = [line for line in done.stderr.splitlines() if line.strip() and "WARNING" not in line]
        return f"batchwizard=={VERSION} could not be installed: {said[-1] if said else f'pip exited with {done.returncode}'}"
    ready.write_text(VERSION)
    return None


def watch(
    *,
    venv: Path,
    pip_env: dict[str, str],
    base_url: str,
    batch_ref: str,
    size: int,
    folder: Path,
    say: Callable[[str], None],
) -> Run | str:
    """batchwizard's `watch` collecting the ended batch `batch_ref` from the emulator at `base_url`:
    its run, or why it was skipped. Its manifest, configuration and results live in `folder`."""
    started = time.perf_counter()
    note = install(venv, env=pip_env)
    if note:
        say(f"batchwizard: skipped, {note}")
        return note
    if (installing := time.perf_counter() - started) > 1:
        say(f"batchwizard {VERSION} installed into {venv} in {installing:,.1f} s (kept for the next run)")
    home = folder / "batchwizard"
    results = home / "results"
    results.mkdir(parents=True)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / "config"),
        "OPENAI_API_KEY": "bench",
        "OPENAI_BASE_URL": base_url,
        "NO_COLOR": "1",
    }
    seeded = subprocess.run(
        [str(venv / "bin" / "python"), "-c", SEED_MANIFEST, batch_ref],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
    )
    if seeded.returncode != 0:
        raise CommandFailed(f"batchwizard's manifest could not be written:\n{seeded.stderr[-4000:]}")
    run = run_measured(
        [
            str(venv / "bin" / "batchwizard"),
            "watch",
            "--output-directory",
            str(results),
            "--check-interval",
            "0",
        ],
        env=env,
        cwd=home,
    )
    written = results / f"{batch_ref}_results.jsonl"
    lines = sum(1 for _ in written.open("rb")) if written.exists() else 0
    if lines != size:
        raise CommandFailed(f"batchwizard wrote {lines} lines for {size} requests:\n{run.output[-4000:]}")
    say(f"batchwizard watch: {size:,} results in {run.seconds:,.2f} s, peak {run.peak_mb:,.0f} MB")
    return run


def figure(batchwizard: Run | str, collect: Run, size: int) -> Figure:
    """BatchDesk's `collect` against batchwizard's `watch`, both whole processes."""
    target = f"ratio ≤ {TARGET_RATIO:.1f} (whole processes)"
    if isinstance(batchwizard, str):
        return Figure(NAME, "skipped: batchwizard not installed", "—", None, target, None)
    ratio = collect.seconds / batchwizard.seconds
    return Figure(
        name=NAME,
        value=f"{collect.seconds:,.2f} s collect ({size:,})",
        baseline=f"{batchwizard.seconds:,.2f} s batchwizard watch",
        ratio=ratio,
        target=target,
        passed=ratio <= TARGET_RATIO,
    )
