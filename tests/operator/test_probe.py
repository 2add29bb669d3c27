"""The sidecar's exec startup probe, run as the kubelet runs it: a process that exits 0 or not."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from openforge_operator import probe


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openforge_operator.probe", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_passes_once_the_port_listens_and_fails_before() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        refused = run(str(port))
        assert refused.returncode == 1 and f"127.0.0.1:{port}" in refused.stderr
        server.listen()
        assert run(str(port)).returncode == 0


def test_with_a_file_passes_only_once_the_file_exists_too(tmp_path: Path) -> None:
    ready = tmp_path / "sidecar-ready"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        waiting = run(str(port), str(ready))
        assert waiting.returncode == 1 and str(ready) in waiting.stderr
        ready.touch()
        assert run(str(port), str(ready)).returncode == 0


def test_bad_arguments_are_a_usage_error() -> None:
    for args in ([], ["x"], ["0"], ["70000"], ["1", "2", "3"]):
        result = run(*args)
        assert result.returncode == 2 and "usage" in result.stderr


def test_command_runs_this_module() -> None:
    assert probe.command(15090) == ["python", "-m", "openforge_operator.probe", "15090"]
    assert (
        probe.command(15090, "/openforge/run/sidecar-ready")[-1] == "/openforge/run/sidecar-ready"
    )
