"""Fixtures that start real OpenForge processes on 127.0.0.1.

Every server here is the real thing (the `openforge` CLI in a subprocess);
tests talk to it over real sockets. Ports are picked free per test run.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from openforge_runner.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
TINY_TOKENIZER = ROOT / "trainer" / "openforge_trainer" / "assets" / "tiny-tokenizer"


def wait_port(
    port: int, process: subprocess.Popen[bytes] | None = None, timeout: float = 30.0
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(
                f"process exited with {process.returncode} before listening on {port}"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout} s")


@dataclass
class Proc:
    """A started `openforge` subprocess and where it listens."""

    args: list[str]
    port: int
    log: Path
    process: subprocess.Popen[bytes] = field(init=False)

    def start(self) -> Proc:
        handle = self.log.open("ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "openforge.cli", *self.args],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        wait_port(self.port, self.process)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class Procs:
    """Starts processes for one test and stops them all at its end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[Proc] = []

    free_port = staticmethod(free_port)

    def start(self, name: str, args: list[str], port: int) -> Proc:
        proc = Proc(args, port, self.tmp_path / f"{name}.log").start()
        self.started.append(proc)
        return proc

    def engine(self, *extra: str) -> Proc:
        port = free_port()
        return self.start(
            "engine",
            ["test-engine", "--port", str(port), "--tokenizer", str(TINY_TOKENIZER), *extra],
            port,
        )

    def collector(self, store: Path | None = None, *extra: str, port: int | None = None) -> Proc:
        port = port or free_port()
        store = store or self.tmp_path / "store.db"
        return self.start(
            "collector",
            ["collector", "--store", str(store), "--listen", f"127.0.0.1:{port}", *extra],
            port,
        )

    def sidecar(
        self,
        *extra: str,
        engine: Proc | None = None,
        spool: Path | None = None,
        port: int | None = None,
        name: str = "sidecar",
    ) -> Proc:
        port = port or free_port()
        spool = spool or self.tmp_path / "spool"
        args = ["sidecar", "--listen", f"127.0.0.1:{port}", "--spool", str(spool)]
        if engine is not None:
            args += ["--engine", engine.url]
        return self.start(name, [*args, *extra], port)

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            proc.stop()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    started = Procs(tmp_path)
    try:
        yield started
    finally:
        started.stop_all()


@pytest.fixture(scope="session")
def tiny_tokenizer_dir() -> Path:
    return TINY_TOKENIZER
