"""The runner's services as real child processes, and their supervision."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from openforge_runner import processes


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def until(condition: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_dead_service_is_restarted_on_its_port_and_rollouts_wait_meanwhile(
    tmp_path: Path,
) -> None:
    port = processes.free_port()
    serve = (
        "import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, "
        f"socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(600)"
    )
    service = processes.Service(
        "collector", python(serve), tmp_path / "collector.log", port=port
    ).start()
    stop = threading.Event()
    lines: list[str] = []
    told: list[dict[str, object]] = []
    supervisor = processes.Supervisor(
        stop=stop, backoff=0.5, poll=0.05, log=lines.append, on_event=told.append
    )
    try:
        supervisor.watch(service)
        first = service.process
        assert first is not None
        first.kill()
        until(lambda: not supervisor.up.is_set())  # no rollout starts while it is down
        until(lambda: service.process is not first and service.alive() and supervisor.up.is_set())
        assert supervisor.alive(service) and not stop.is_set() and not supervisor.failure
        assert lines == ["openforge run: collector exited with -9; restarting it in 0.5 s (1/3)"]
        assert supervisor.events == [
            {"event": "service", "service": "collector", "exit_code": -9, "action": "restarted"}
        ]
        assert told == supervisor.events, "told as it happened, not at the end"
    finally:
        supervisor.close()
        service.stop()


def test_what_is_left_of_a_dead_services_group_goes_before_it_restarts(tmp_path: Path) -> None:
    """A trainer's Ray cluster (its GCS and raylet, in the trainer's process group)
    would outlive a SIGKILLed trainer: its restart kills the rest of the group first."""
    pids = tmp_path / "children"
    spawn = (
        "import os, subprocess, sys, time; "
        "child = subprocess.Popen(['sleep', '600']); "
        f"open({str(pids)!r}, 'a').write(f'{{child.pid}}\\n'); time.sleep(600)"
    )
    service = processes.Service("trainer", python(spawn), tmp_path / "trainer.log").start()
    stop = threading.Event()
    supervisor = processes.Supervisor(stop=stop, backoff=0.01, poll=0.05, log=lambda line: None)
    try:
        supervisor.watch(service)
        until(lambda: pids.exists() and len(pids.read_text().split()) == 1)
        (orphan,) = map(int, pids.read_text().split())
        first = service.process
        assert first is not None
        first.kill()  # the leader alone, as the OOM killer or a SIGKILL would
        until(lambda: len(pids.read_text().split()) == 2)  # restarted
        until(lambda: not _running(orphan))
    finally:
        supervisor.close()
        service.stop()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_service_that_keeps_dying_stops_the_run_naming_it(tmp_path: Path) -> None:
    service = processes.Service(
        "trainer", python("import sys; print('boom'); sys.exit(3)"), tmp_path / "trainer.log"
    ).start()
    stop = threading.Event()
    supervisor = processes.Supervisor(
        stop=stop, restarts=2, backoff=0.01, poll=0.05, log=lambda line: None
    )
    try:
        supervisor.watch(service)
        until(stop.is_set)
        assert supervisor.failure.startswith(
            "trainer exited with 3 3 times; giving up (see trainer.log):"
        )
        assert "boom" in supervisor.failure
        assert not supervisor.alive(service)
        assert [e["action"] for e in supervisor.events] == ["restarted", "restarted", "gave up"]
    finally:
        supervisor.close()


def test_a_service_that_exits_0_is_done_not_dead(tmp_path: Path) -> None:
    service = processes.Service("trainer", python("pass"), tmp_path / "trainer.log").start()
    stop = threading.Event()
    supervisor = processes.Supervisor(stop=stop, backoff=0.01, poll=0.05, log=lambda line: None)
    try:
        supervisor.watch(service)
        assert service.process is not None
        service.process.wait(30)
        time.sleep(0.5)
        assert supervisor.events == [] and not stop.is_set() and supervisor.up.is_set()
        assert not supervisor.alive(service)  # a waiter for its work learns it is over
    finally:
        supervisor.close()


def test_serve_and_train_each_take_half_the_cores_unless_the_user_chose() -> None:
    cores = len(os.sched_getaffinity(0))
    assert processes.torch_threads_env({}) == {"OMP_NUM_THREADS": str(max(1, cores // 2))}
    assert processes.torch_threads_env({"OMP_NUM_THREADS": "7"}) == {}
