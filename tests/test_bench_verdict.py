"""`make bench` and `make bench-quick` (issue 29, point 5): a figure that misses its target fails the
command; the quick run measures the hot paths and three screens; the figure beside batchwizard is
skipped, not failed, where batchwizard cannot be installed. No bench is run here and nothing is timed."""

import io
import os

import pytest
from django.core.management import CommandError, call_command

from ledger.bench import batchwizard, screens
from ledger.bench.base import Figure, work_seconds
from ledger.bench.measuring import CommandFailed, Run
from ledger.bench.run import QUICK_FIGURES, figures_to_run
from ledger.management.commands.bench import Command


def figure(name: str, passed: bool | None) -> Figure:
    return Figure(name, "1,000 rows/s", "2,000 rows/s COPY", 0.5, "ratio ≥ 0.50", passed)


def test_a_figure_that_misses_its_target_fails_the_command_after_the_table():
    out = io.StringIO()
    with pytest.raises(CommandError, match=r"^1 of 3 figures missed their target: the import$"):
        Command(stdout=out).report(
            [figure("the export", True), figure("the import", False), figure("a ceiling", None)]
        )
    assert "the import" in out.getvalue() and "FAIL" in out.getvalue()


def test_a_run_whose_targets_all_hold_or_judge_nothing_succeeds():
    out = io.StringIO()
    Command(stdout=out).report([figure("the export", True), figure("a ceiling", None)])
    assert "FAIL" not in out.getvalue()


def test_the_quick_run_measures_the_hot_paths_and_nothing_else():
    assert figures_to_run(list(QUICK_FIGURES)) == ["import", "create_job", "collection", "screens"]


def check(name: str) -> tuple:
    return (name, f"/{name}", {}, "admin", "/admin/")


def test_the_quick_run_measures_three_screens_in_their_order():
    checks = [check("screen /, dashboard"), *(check(name) for name in reversed(screens.QUICK_SCREENS))]
    assert [row[0] for row in screens.only(checks, screens.QUICK_SCREENS)] == list(
        reversed(screens.QUICK_SCREENS)
    )
    assert screens.QUICK_SCREENS == (
        "screen /review/, first draft",
        "screen /jobs/{id}/, last page",
        "screen /catalogue/ search by a SKU prefix of 1,000",
    )


def test_a_quick_screen_no_check_has_is_said_not_measured_as_nothing():
    with pytest.raises(CommandFailed, match="no screen is named screen /jobs/{id}/, last page"):
        screens.only([check(screens.REVIEW_DESK), check(screens.SKU_PREFIX_SEARCH)], screens.QUICK_SCREENS)


def test_the_quick_run_chooses_its_own_figures():
    with pytest.raises(CommandError, match="--quick measures its own figures"):
        call_command("bench", "--quick", "--figures", "import")


def test_batchwizard_is_skipped_with_pips_reason_where_it_cannot_be_installed(tmp_path):
    # An index nothing answers at, and none of this machine's pip configuration (its other indexes
    # and wheel folders).
    pip_env = {name: value for name, value in os.environ.items() if not name.startswith("PIP_")}
    pip_env |= {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_RETRIES": "0",
    }
    said = []
    beside = batchwizard.watch(
        venv=tmp_path / "venv",
        pip_env=pip_env,
        base_url="http://127.0.0.1:9/v1",
        batch_ref="batch_never_made",
        size=1,
        folder=tmp_path,
        say=said.append,
    )
    assert (
        beside
        == "batchwizard==0.5.0 could not be installed: ERROR: No matching distribution found for batchwizard==0.5.0"
    )
    assert said == [f"batchwizard: skipped, {beside}"]
    # Nothing half-made is kept to be taken for an installation next time.
    assert not (tmp_path / "venv").exists()
    row = batchwizard.figure(beside, Run(seconds=7.5, peak_bytes=180_000_000, output=""), 50_000)
    assert (row.value, row.ratio, row.passed) == ("skipped: batchwizard not installed", None, None)
    Command(stdout=io.StringIO()).report([row])


def test_batchdesk_slower_than_batchwizard_misses_the_target():
    collect = Run(seconds=7.5, peak_bytes=180_000_000, output="")
    assert not batchwizard.figure(Run(seconds=3.0, peak_bytes=0, output=""), collect, 50_000).passed
    assert batchwizard.figure(Run(seconds=7.5, peak_bytes=0, output=""), collect, 50_000).passed


def test_work_shorter_than_a_share_of_djangos_start_is_shown_not_judged():
    # A command's work is its run less an idle start; a difference within the start's own noise
    # (an unchanged re-import of a small catalogue) would give any rate at all.
    assert work_seconds(Run(seconds=1.21, peak_bytes=1, output=""), 1.2) == (pytest.approx(0.01), False)
    assert work_seconds(Run(seconds=1.0, peak_bytes=1, output=""), 1.2)[1] is False
    assert work_seconds(Run(seconds=3.2, peak_bytes=1, output=""), 1.2) == (pytest.approx(2.0), True)
