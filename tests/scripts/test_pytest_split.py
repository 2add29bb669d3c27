"""scripts/pytest_split.sh: the suite in two pytest processes side by side.

Real pytest on a small suite of its own in a temporary folder: two tests that each wait
for the other (so they pass only if they run at the same time), one that fails on
request, and a folder standing in for the tier that runs in the background.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPLIT = ROOT / "scripts" / "pytest_split.sh"

MEET = """
import os, time
from pathlib import Path

def meet(mine, theirs):
    Path(mine).touch()
    if os.environ.get("MEET") != "1":
        return
    deadline = time.monotonic() + float(os.environ.get("MEET_S", "60"))
    while not Path(theirs).exists():
        assert time.monotonic() < deadline, "the other process never ran beside this one"
        time.sleep(0.05)
"""


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "tests" / "waits").mkdir(parents=True)
    (tmp_path / "tests" / "meet.py").write_text(MEET)
    (tmp_path / "tests" / "test_rest.py").write_text(
        "import sys; sys.path.insert(0, __file__.rsplit('/', 1)[0]); from meet import meet\n"
        "def test_rest(): meet('rest.ran', 'waits.ran')\n"
    )
    (tmp_path / "tests" / "waits" / "test_waits.py").write_text(
        "import os, sys; sys.path.insert(0, __file__.rsplit('/', 2)[0]); from meet import meet\n"
        "def test_waits(): meet('waits.ran', 'rest.ran')\n"
        "def test_fails_on_request(): assert os.environ.get('FAIL') != '1'\n"
    )
    return tmp_path


def split(suite: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        ["bash", str(SPLIT), "-p", "no:cacheprovider", "-rA", *args],
        cwd=suite, capture_output=True, text=True, timeout=240, check=False,
        env={**os.environ, "PATH": path, "OPENFORGE_TEST_BESIDE": "tests/waits", **env},
    )  # fmt: skip


def passed(output: str) -> list[str]:
    return sorted(line.split()[1] for line in output.splitlines() if line.startswith("PASSED "))


def test_the_background_runs_beside_the_rest_and_is_printed_after_it(suite: Path) -> None:
    done = split(suite, MEET="1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert passed(done.stdout) == [
        "tests/test_rest.py::test_rest",
        "tests/waits/test_waits.py::test_fails_on_request",
        "tests/waits/test_waits.py::test_waits",
    ]  # each once, though both processes were given the same arguments
    rest, _, background = done.stdout.partition("== pytest: tests/waits\n")
    assert "test_rest" in rest and "test_waits" not in rest
    assert "test_waits" in background and "test_rest" not in background


def test_a_failure_in_the_background_fails_the_run(suite: Path) -> None:
    done = split(suite, FAIL="1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED tests/waits/test_waits.py::test_fails_on_request" in done.stdout
    assert "exit 0 for the rest, 1 for tests/waits" in done.stderr


def test_nothing_collected_on_one_side_is_not_a_failure(suite: Path) -> None:
    done = split(suite, "-k", "test_rest")
    assert done.returncode == 0, done.stdout + done.stderr
    assert passed(done.stdout) == ["tests/test_rest.py::test_rest"]
    assert split(suite, "-k", "no_such_test").returncode == 5


def test_naming_a_path_runs_one_pytest_as_given(suite: Path) -> None:
    done = split(suite, "tests/waits/test_waits.py::test_waits", MEET="1", MEET_S="2")
    assert done.returncode == 1  # alone, it waits for the rest in vain
    assert "the other process never ran beside this one" in done.stdout
    assert "== pytest\n" in done.stdout and "background" not in done.stdout


def test_a_background_path_that_does_not_exist_is_named(suite: Path) -> None:
    done = split(suite, OPENFORGE_TEST_BESIDE="tests/waits tests/gone")
    assert done.returncode == 2
    assert "pytest_split.sh: tests/gone (OPENFORGE_TEST_BESIDE) does not exist" in done.stderr
