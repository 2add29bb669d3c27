"""scripts/setup.sh: silent but for the venv's path, and a failing step's whole output.

Each test points ``OPENFORGE_CACHE`` at its own folder, so the environment these tests
run in is never touched.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "scripts" / "setup.sh"


def key() -> str:
    text = (ROOT / "pyproject.toml").read_bytes() + (ROOT / "constraints.txt").read_bytes()
    return hashlib.sha256(text).hexdigest()[:16]


def setup(cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENFORGE_CACHE": str(cache)}
    return subprocess.run(
        ["bash", str(SETUP)], capture_output=True, text=True, env=env, timeout=600, check=False
    )


def test_a_set_up_environment_is_refreshed_in_silence(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    (venv / ".openforge-stamp").write_text(key() + "\n")  # the pinned install is current
    done = setup(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{venv}\n" and done.stderr == "", (done.stdout, done.stderr)
    shown = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "show", "openforge"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "Version: 0.1.0" in shown.stdout  # the editable install did happen


def test_a_failing_step_prints_its_whole_output(tmp_path: Path) -> None:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"
    python.write_text(
        "#!/bin/sh\necho 'first line of the failure'\necho 'ERROR: no such thing' >&2\nexit 3\n"
    )
    python.chmod(0o755)
    (tmp_path / "venv" / ".openforge-stamp").write_text(key() + "\n")
    done = setup(tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert "scripts/setup.sh: failed:" in done.stderr
    assert "first line of the failure" in done.stderr and "ERROR: no such thing" in done.stderr
