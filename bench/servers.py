"""The servers a benchmark phase runs: test engine, OpenForge sidecar, stock mitmdump.

Each is a real subprocess listening on 127.0.0.1 on a free port, its output
in a log file; :class:`Servers` stops them all (SIGTERM, then SIGKILL) at
the end, whatever happened. Memory is read from ``/proc/<pid>/status``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

BENCH = Path(__file__).resolve().parent
TEE_ADDON = BENCH / "tee_addon.py"
PROFILE_ADDON = BENCH / "profile_addon.py"
# `openforge test-engine`, set up as real engines (vLLM on uvicorn) serve: a listen backlog
# of 128 instead of socketserver's 5, which 50 clients connecting at once overflow (their
# connections are reset), and TCP_NODELAY, without which Nagle's algorithm meets delayed
# ACKs and stalls small streamed writes for ~40 ms.
ENGINE_MAIN = (
    "import sys; from openforge_trainer.testengine import engine as testengine; "
    "testengine.EngineServer.request_queue_size = 128; "
    "testengine._Handler.disable_nagle_algorithm = True; "
    "sys.exit(testengine.main(sys.argv[1:]))"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_listening(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode}; see {self.log}:\n"
                    f"{self.tail()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(
            f"{self.name} is not listening on 127.0.0.1:{self.port} after {timeout} s"
        )

    def stop(self, timeout: float = 20.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def tail(self, size: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-size:] if self.log.exists() else ""


class Servers:
    """Starts the servers of one phase; a context manager that stops them all."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[Server] = []

    def __enter__(self) -> Servers:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for server in reversed(self.started):
            server.stop()

    def start(
        self, name: str, argv: list[str], port: int, *, env: dict[str, str] | None = None
    ) -> Server:
        """Start ``argv`` (with ``env`` added to this process's environment) and wait
        until it listens on ``port``."""
        log = self.workdir / f"{name}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        with log.open("ab") as handle:
            process = subprocess.Popen(
                argv, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        server = Server(name, port, process, log)
        self.started.append(server)
        server.wait_listening()
        return server

    def engine(self, *, token_delay_ms: float) -> Server:
        port = free_port()
        argv = [
            sys.executable,
            "-c",
            ENGINE_MAIN,
            "--port",
            str(port),
            "--token-delay-ms",
            str(token_delay_ms),
        ]
        return self.start("engine", argv, port)

    def collector(self, tag: str = "") -> Server:
        """``openforge collector`` with a fresh store, as a trainer runs it."""
        port = free_port()
        argv = [
            sys.executable, "-m", "openforge.cli", "collector",
            "--store", str(self.workdir / f"store{tag}.db"), "--listen", f"127.0.0.1:{port}",
        ]  # fmt: skip
        return self.start(f"collector{tag}", argv, port)

    def sidecar(
        self,
        engine: Server,
        *,
        collector: Server | None = None,
        launcher: tuple[str, ...] = (sys.executable, "-m", "openforge.cli"),
    ) -> Server:
        """``openforge sidecar`` of this checkout (``launcher``: what runs the CLI)."""
        port = free_port()
        spool = self.workdir / "spool"
        argv = [
            *launcher,
            "sidecar",
            "--listen",
            f"127.0.0.1:{port}",
            "--engine",
            engine.url,
            "--spool",
            str(spool),
            *_exporting(collector),
        ]
        return self.start("sidecar", argv, port)

    def sidecar_of(
        self, tree: Path, engine: Server, tag: str, *, collector: Server | None = None
    ) -> Server:
        """``openforge sidecar`` of the checkout at ``tree`` (its ``sidecar/`` and
        shared package's folder first on ``sys.path``: ``common/``, or ``proto/`` in a
        checkout older than that folder), e.g. ``git worktree add /tmp/old <commit>``."""
        port = free_port()
        shared = tree / "common" if (tree / "common").is_dir() else tree / "proto"
        main = (
            f"import sys; sys.path[:0] = [{str(tree / 'sidecar')!r}, {str(shared)!r}]; "
            "from openforge_sidecar import cli; sys.exit(cli.main(sys.argv[1:]))"
        )
        flags = [
            "--listen",
            f"127.0.0.1:{port}",
            "--engine",
            engine.url,
            "--spool",
            str(self.workdir / f"spool-{tag}"),
            *_exporting(collector),
        ]
        return self.start(f"sidecar-{tag}", [sys.executable, "-c", main, *flags], port)

    def profiled_sidecar(self, engine: Server, profile_flags: list[str]) -> Server:
        """The sidecar as ``openforge sidecar`` runs it, plus ``profile_addon.py`` given
        ``profile_flags``."""
        port = free_port()
        flags = [
            "--listen",
            f"127.0.0.1:{port}",
            "--engine",
            engine.url,
            "--spool",
            str(self.workdir / "spool"),
        ]
        argv = [sys.executable, str(PROFILE_ADDON), *profile_flags, "--", *flags]
        return self.start("sidecar", argv, port)

    def mitmdump(
        self, engine: Server, *, addon: bool = True, env: dict[str, str] | None = None
    ) -> Server:
        """Stock mitmdump in reverse mode, quiet like the sidecar, with only the trivial
        tee addon (none without ``addon``), its certificates in the workdir."""
        port = free_port()
        argv = [
            str(Path(sys.executable).with_name("mitmdump")),
            "--mode", f"reverse:{engine.url}",
            "--listen-host", "127.0.0.1",
            "--listen-port", str(port),
            *(("-s", str(TEE_ADDON)) if addon else ()),
            "--set", f"confdir={self.workdir / 'mitmproxy'}",
            "--set", "connection_strategy=lazy",
            "--set", "flow_detail=0",
            "--set", "termlog_verbosity=warn",
        ]  # fmt: skip
        return self.start("mitmdump", argv, port, env=env)


def _exporting(collector: Server | None) -> list[str]:
    return ["--collector", f"127.0.0.1:{collector.port}"] if collector is not None else []


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak resident set) of a live process, in KiB."""
    found: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0])
    return found
