"""The runner's waits on the trainer: its own servers up for a step (the engines file), and
its last step done."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from openforge import policy_servers
from openforge_runner import runner


def write_later(path: Path, engines: policy_servers.Engines, delay: float) -> threading.Timer:
    timer = threading.Timer(delay, policy_servers.write, args=(path, engines))
    timer.start()
    return timer


def test_the_servers_are_waited_for_until_the_trainer_says_they_are_up_for_the_step(
    tmp_path: Path,
) -> None:
    path = tmp_path / policy_servers.FILE
    stop = threading.Event()
    # an earlier step's file is not this step's
    policy_servers.write(path, policy_servers.Engines(step=1, addresses=("10.0.0.5:1",)))
    up = policy_servers.Engines(step=2, addresses=("10.0.0.5:2", "10.0.0.6:2"))
    write_later(path, up, 0.3).join()
    started = time.monotonic()
    assert runner.wait_for_servers(path, 2, alive=lambda: True, stop=stop, timeout=5) == up
    assert time.monotonic() - started < 1
    later = policy_servers.Engines(step=3, addresses=("10.0.0.5:3",))
    timer = write_later(path, later, 0.6)
    assert runner.wait_for_servers(path, 3, alive=lambda: True, stop=stop, timeout=5) == later
    timer.join()


def test_a_stop_a_dead_trainer_a_timeout_and_a_bad_file_end_the_wait(tmp_path: Path) -> None:
    path = tmp_path / policy_servers.FILE
    stopped = threading.Event()
    stopped.set()
    assert runner.wait_for_servers(path, 1, alive=lambda: True, stop=stopped, timeout=5) is None
    running = threading.Event()
    with pytest.raises(RuntimeError, match="the trainer stopped before its servers were up"):
        runner.wait_for_servers(path, 1, alive=lambda: False, stop=running, timeout=5)
    with pytest.raises(TimeoutError, match=r"not up for step 1 within 0\.6 s"):
        runner.wait_for_servers(path, 1, alive=lambda: True, stop=running, timeout=0.6)
    path.write_text('{"step": 1, "addresses": "10.0.0.5:1"}')
    with pytest.raises(policy_servers.EnginesError, match="addresses must be a non-empty list"):
        runner.wait_for_servers(path, 1, alive=lambda: True, stop=running, timeout=5)


def test_the_last_step_is_done_when_the_trainer_has_exited() -> None:
    running = threading.Event()
    ends = time.monotonic() + 0.4
    assert runner.wait_until_done(lambda: time.monotonic() < ends, stop=running, timeout=5)
    stopped = threading.Event()
    stopped.set()
    assert not runner.wait_until_done(lambda: False, stop=stopped, timeout=5)
    with pytest.raises(TimeoutError, match="still training its last step"):
        runner.wait_until_done(lambda: True, stop=running, timeout=0.3)
