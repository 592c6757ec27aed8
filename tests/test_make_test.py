"""`make test` on a fresh machine. scripts/find-chromium finds Chromium, installs it as root with
apt-get, or stops with one line naming the package (run here with a PATH holding only stand-ins);
the suite runs on PostgreSQL, then the screens and the role matrix once more on SQLite."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "find-chromium"
MISSING = "Chromium is missing: install the package chromium (sudo apt-get install chromium) and run make test again."


def stand_in(bin_dir: Path, name: str, body: str) -> Path:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def find_chromium(bin_dir: Path, *command: str) -> subprocess.CompletedProcess:
    env = {"PATH": str(bin_dir), "CHROMIUM_FALLBACK": str(bin_dir / "no-such-chromium")}
    return subprocess.run(
        command or ["/bin/sh", str(SCRIPT)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=30
    )


def test_a_chromium_on_path_is_printed(tmp_path):
    chromium = stand_in(tmp_path, "chromium-browser", "exit 0")
    done = find_chromium(tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{chromium}\n", "")


def test_the_fallback_location_is_used_when_path_has_none(tmp_path):
    fallback = stand_in(tmp_path, "chromium-at-a-fixed-place", "exit 0")
    done = subprocess.run(
        ["/bin/sh", str(SCRIPT)],
        env={"PATH": str(tmp_path / "empty"), "CHROMIUM_FALLBACK": str(fallback)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (done.returncode, done.stdout) == (0, f"{fallback}\n")


def test_without_chromium_and_without_root_one_line_names_the_package(tmp_path):
    stand_in(tmp_path, "id", "echo 1000")
    apt_log = tmp_path / "apt.log"
    stand_in(tmp_path, "apt-get", f'echo "$@" >> {apt_log}')
    done = find_chromium(tmp_path)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [MISSING]
    assert not apt_log.exists(), "apt-get must not run for a user who is not root"


def test_root_with_apt_get_installs_debians_chromium(tmp_path):
    stand_in(tmp_path, "id", "echo 0")
    apt_log = tmp_path / "apt.log"
    installs = f'[ "$1" = install ] && printf "#!/bin/sh\\n" > {tmp_path}/chromium && /bin/chmod +x {tmp_path}/chromium'
    stand_in(
        tmp_path, "apt-get", f'echo "$@ DEBIAN_FRONTEND=$DEBIAN_FRONTEND" >> {apt_log}\n{installs}\nexit 0'
    )
    done = find_chromium(tmp_path)
    assert (done.returncode, done.stdout) == (0, f"{tmp_path / 'chromium'}\n"), done.stderr
    assert apt_log.read_text().splitlines() == [
        "update -qq DEBIAN_FRONTEND=",
        "install -y -qq chromium DEBIAN_FRONTEND=noninteractive",
    ]


def test_a_failed_install_stops_with_one_line_after_the_attempt(tmp_path):
    stand_in(tmp_path, "id", "echo 0")
    stand_in(tmp_path, "apt-get", "exit 100")
    done = find_chromium(tmp_path)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith("Installing Chromium failed: install the package chromium")


def test_make_stops_at_once_with_the_line_naming_the_package(tmp_path):
    stand_in(tmp_path, "id", "echo 1000")
    done = find_chromium(tmp_path, "/usr/bin/make", "--no-print-directory", "chromium")
    assert done.returncode != 0
    lines = done.stderr.splitlines()
    # Only make's own closing line follows.
    assert lines[0] == MISSING and len(lines) == 2 and lines[1].startswith("make: ***"), done.stderr


def test_make_test_looks_for_chromium_first_and_hands_it_to_pytest():
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "--always-make", "test"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "scripts/find-chromium >/dev/null", "before the venv is built"
    pytest_line = next(line for line in lines if "-m pytest" in line)
    assert "BATCHDESK_CHROMIUM=$(scripts/find-chromium)" in pytest_line


def test_without_chromium_a_browser_test_fails_with_one_clear_message():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/review/test_browser.py::test_a_hostile_draft_is_shown_as_text_and_never_runs",
        ],
        env={**os.environ, "BATCHDESK_CHROMIUM": "/no/such/chromium"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout
    assert "1 error" in done.stdout
    message = "No Chromium at /no/such/chromium: run `make test` (it finds or installs Chromium)"
    assert message in done.stdout
    assert "Traceback" not in done.stdout and "playwright" not in done.stdout.lower()


def test_make_test_runs_the_screens_and_the_role_matrix_once_more_on_sqlite():
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "test"], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    pytest_lines = [line for line in done.stdout.splitlines() if "-m pytest" in line]
    assert len(pytest_lines) == 2
    assert pytest_lines[1].startswith("DATABASE_URL=sqlite:///")
    assert "tests/review" in pytest_lines[1].split() and '"not browser and not pipeline"' in pytest_lines[1]
