"""Local services as child processes: start, wait until they listen, stop.

Every OpenForge service ``openforge run`` needs is started through the
``openforge`` command itself (``python -m openforge.cli ...``), in its own
process group, logging to a file in the run directory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


class ServiceError(RuntimeError):
    """A service did not start; the message holds the end of its log."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Service:
    name: str
    argv: list[str]
    log: Path
    port: int | None = None
    env: dict[str, str] | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _log_start: int = field(default=0, init=False)  # the log's size when this process started

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, timeout: float = 120.0) -> Service:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as handle:
            self._log_start = handle.tell()
            self.process = subprocess.Popen(
                self.argv,
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(self.env or {})},
                start_new_session=True,
            )
        if self.port is not None:
            self._wait_listening(timeout)
        return self

    def _wait_listening(self, timeout: float) -> None:
        assert self.process is not None and self.port is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServiceError(
                    f"{self.name} exited with {self.process.returncode}:\n{self.tail()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise ServiceError(
            f"{self.name} did not listen on 127.0.0.1:{self.port} within {timeout:.0f} s:\n{self.tail()}"
        )

    def wait_for_line(self, text: str | tuple[str, ...], *, timeout: float = 300.0) -> None:
        """Wait until the service's log has a line starting with ``text`` (or one of them).

        Raises ServiceError with the end of the log if it exits (or the time
        runs out) first: e.g. ``openforge train`` rejecting its settings.
        """
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            exited = self.process.poll() is not None
            if any(line.startswith(text) for line in self._new_lines()):
                return
            if exited:
                raise ServiceError(
                    f"{self.name} exited with {self.process.returncode}:\n{self.tail()}"
                )
            time.sleep(0.1)
        raise ServiceError(
            f"{self.name} did not say {text!r} within {timeout:.0f} s:\n{self.tail()}"
        )

    def _new_lines(self) -> list[str]:
        try:
            with self.log.open("rb") as handle:
                handle.seek(self._log_start)
                return handle.read().decode(errors="replace").splitlines()
        except OSError:
            return []

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, *, timeout: float = 30.0) -> int | None:
        """SIGTERM the service's process group; SIGKILL it after ``timeout``."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def openforge(*args: str) -> list[str]:
    """The argv that runs an ``openforge`` subcommand with this interpreter."""
    return [sys.executable, "-m", "openforge.cli", *args]


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
