"""Local services as child processes: start, wait until they listen, stop.

Every OpenForge service ``openforge run`` needs is started through the
``openforge`` command itself (``python -m openforge.cli ...``), in its own
process group, logging to a file in the run directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ServiceError(RuntimeError):
    """A service did not start; the message holds the end of its log."""


class Stopped(ServiceError):
    """The run was asked to stop while a service was starting."""


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
    stopping: threading.Event | None = None
    """Set: the run is stopping, and a wait for this service to start gives up at once
    (:class:`Stopped`)."""
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
                tethered(self.argv),
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
            self._check_stop()
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
            f"{self.name} did not listen on 127.0.0.1:{self.port} within {timeout:.0f} s:\n"
            f"{self.tail()}"
        )

    def wait_for_line(self, text: str | tuple[str, ...], *, timeout: float = 300.0) -> None:
        """Wait until the service's log has a line starting with ``text`` (or one of them).

        Raises ServiceError with the end of the log if it exits (or the time
        runs out) first: e.g. ``openforge train`` rejecting its settings.
        """
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_stop()
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

    def _check_stop(self) -> None:
        if self.stopping is not None and self.stopping.is_set():
            raise Stopped(f"stopped while {self.name} was starting")

    def _new_lines(self) -> list[str]:
        try:
            with self.log.open("rb") as handle:
                handle.seek(self._log_start)
                return handle.read().decode(errors="replace").splitlines()
        except OSError:
            return []

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def exit_code(self) -> int | None:
        """The process's exit code once it has exited (as :meth:`alive` saw it); else None."""
        return self.process.returncode if self.process is not None else None

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


SETPRIV = shutil.which("setpriv")


def tethered(argv: list[str]) -> list[str]:
    """``argv``, run so that the process is sent SIGTERM when the thread that started it
    dies (``setpriv --pdeathsig``, util-linux): a runner killed outright takes its
    services and sidecars with it, instead of leaving them serving and writing. As it
    is where setpriv is missing."""
    return [SETPRIV, "--pdeathsig", "TERM", "--", *argv] if SETPRIV else list(argv)


def torch_threads_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a torch service ``openforge run`` starts (serve, train).

    They share this machine with each other and with the rollouts, so each takes half
    its cores for torch's threads (``OMP_NUM_THREADS``), at least one: at torch's
    default, both take every core and spin against each other and the harnesses (on 2
    cores, 2 iterations of the Codex learning job take 140 CPU-seconds at torch's
    default and 104 with one thread each, in no more wall time). An ``OMP_NUM_THREADS``
    already set is the user's, and kept."""
    if (os.environ if environ is None else environ).get("OMP_NUM_THREADS"):
        return {}
    return {"OMP_NUM_THREADS": str(max(1, len(os.sched_getaffinity(0)) // 2))}


def openforge(*args: str) -> list[str]:
    """The argv that runs an ``openforge`` subcommand with this interpreter."""
    return [sys.executable, "-m", "openforge.cli", *args]


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


@dataclass
class _Watched:
    service: Service
    argv: Callable[[], list[str]] | None
    restarts: int = 0


class Supervisor:
    """Restarts a run's services when they die (exit other than 0): each at most ``restarts`` times,
    after a backoff that doubles (``backoff`` s first). A service that keeps dying ends the run:
    :attr:`failure` says which and why, and ``stop`` is set.

    ``up`` is set while every watched service runs: the runner starts no rollout while a
    service (the collector above all) is down. :meth:`close` stops watching (before the
    services are stopped, so that their stop is not taken for a death). Each restart or
    surrender is an event (:attr:`events`), passed to ``on_event`` as it happens (the
    run's journal: a runner killed later keeps them).
    """

    def __init__(
        self,
        *,
        stop: threading.Event,
        restarts: int = 3,
        backoff: float = 1.0,
        log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
        poll: float = 0.5,
        on_event: Callable[[dict[str, Any]], None] = lambda event: None,
    ) -> None:
        self.stop = stop
        self.on_event = on_event
        self.restarts = restarts
        self.backoff = backoff
        self.log = log
        self.poll = poll
        self.up = threading.Event()
        self.up.set()
        self.failure = ""
        self.events: list[dict[str, Any]] = []
        self._watched: list[_Watched] = []
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._watch, name="openforge-supervisor", daemon=True
        )
        self._thread.start()

    def watch(self, service: Service, *, argv: Callable[[], list[str]] | None = None) -> Service:
        """Watch a started ``service``; ``argv`` gives its command line for a restart
        (default: the one it started with)."""
        with self._lock:
            self._watched.append(_Watched(service, argv))
        return service

    def alive(self, service: Service) -> bool:
        """Whether ``service`` runs or is being restarted (it died, and was not given up on)."""
        if service.alive():
            return True
        return service.exit_code() != 0 and not self.failure and not self._closed.is_set()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=10)

    def _watch(self) -> None:
        while not self._closed.wait(self.poll):
            with self._lock:
                # a service that exited 0 is done (the trainer, its steps trained), not dead
                self._watched = [
                    w for w in self._watched if w.service.alive() or w.service.exit_code() != 0
                ]
                dead = [w for w in self._watched if not w.service.alive()]
            if not dead:
                self.up.set()
                continue
            self.up.clear()
            for watched in dead:
                if self._closed.is_set() or self.failure:
                    return
                self._restart(watched)

    def _event(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self.on_event(event)

    def _restart(self, watched: _Watched) -> None:
        service = watched.service
        code = service.process.returncode if service.process is not None else None
        if watched.restarts >= self.restarts:
            self.failure = (
                f"{service.name} exited with {code} {watched.restarts + 1} times; giving up (see "
                f"{service.log.name}):\n{service.tail()}"
            )
            self._event(
                {
                    "event": "service",
                    "service": service.name,
                    "exit_code": code,
                    "action": "gave up",
                }
            )
            self.log(f"openforge run: {service.name} keeps dying; stopping the run")
            self.stop.set()
            return
        delay = self.backoff * 2**watched.restarts
        watched.restarts += 1
        self.log(
            f"openforge run: {service.name} exited with {code}; restarting it in {delay:g} s "
            f"({watched.restarts}/{self.restarts})"
        )
        self._event(
            {"event": "service", "service": service.name, "exit_code": code, "action": "restarted"}
        )
        if self._closed.wait(delay):
            return
        if service.process is not None:
            # what is left of its process group (a trainer's Ray cluster: its GCS and
            # raylet, whose workers end with them) would outlive it and hold on to memory
            _signal_group(service.process.pid, signal.SIGKILL)
        if watched.argv is not None:
            service.argv = watched.argv()
        try:
            service.start()
        except ServiceError as exc:
            self.log(f"openforge run: {service.name} did not come back: {exc}")
