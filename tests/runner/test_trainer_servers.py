"""The policy served by the trainer itself (veRL's own vLLM servers): where an iteration's
servers are and when an iteration is trained, read from the trainer's engines file and
its process."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from openforge import policy_servers
from openforge_runner import trainer_servers


class Trainer:
    """What the runner sees of the trainer: its exit code and whether it is alive."""

    def __init__(self) -> None:
        self.code: int | None = None
        self.given_up = False

    def alive(self) -> bool:
        return self.code is None or (self.code != 0 and not self.given_up)


def servers_of(
    path: Path, trainer: Trainer, *, stop: threading.Event | None = None, timeout: float = 30
) -> trainer_servers.TrainerServers:
    return trainer_servers.TrainerServers(
        path,
        exit_code=lambda: trainer.code,
        alive=trainer.alive,
        stop=stop or threading.Event(),
        timeout=timeout,
    )


def later(delay: float, action: object, *args: object) -> threading.Timer:
    timer = threading.Timer(delay, action, args=args)  # type: ignore[arg-type]
    timer.start()
    return timer


def test_an_iterations_servers_are_the_ones_the_trainer_names_for_its_step(
    tmp_path: Path,
) -> None:
    """Step s's servers serve iteration s - 1; a file naming an earlier step is not taken."""
    path = tmp_path / policy_servers.FILE
    servers = servers_of(path, Trainer())
    policy_servers.write(path, policy_servers.Engines(step=1, addresses=("10.0.0.5:1",)))
    up = policy_servers.Engines(step=2, addresses=("10.0.0.5:2", "10.0.0.6:2"))
    started = time.monotonic()
    timer = later(0.8, policy_servers.write, path, up)
    assert servers.up_for(1) == up and up.iteration == 1
    assert time.monotonic() - started >= 0.7  # step 1's file was there all along
    timer.join()
    # trained once the servers are up for the next iteration
    timer = later(0.6, policy_servers.write, path, policy_servers.Engines(3, ("10.0.0.5:3",)))
    assert servers.trained(1) == 2
    timer.join()


def test_the_last_iteration_is_trained_when_the_trainer_has_exited_0(tmp_path: Path) -> None:
    path = tmp_path / policy_servers.FILE
    trainer = Trainer()
    servers = servers_of(path, trainer)
    timer = later(0.6, setattr, trainer, "code", 1)  # it died: being restarted, not done
    later(1.2, setattr, trainer, "code", 0)
    started = time.monotonic()
    assert servers.trained(4) == 5
    assert time.monotonic() - started >= 1.1
    timer.join()
    # a trainer that has finished serves nothing more (a rerun after its last checkpoint)
    assert servers.up_for(5) is None


def test_a_restarted_trainers_servers_are_waited_for_anew(tmp_path: Path) -> None:
    path = tmp_path / policy_servers.FILE
    servers = servers_of(path, Trainer())
    policy_servers.write(path, policy_servers.Engines(step=2, addresses=("10.0.0.5:2",)))
    servers.forget()  # the trainer restarts
    new = policy_servers.Engines(step=2, addresses=("10.0.0.9:7",))
    timer = later(0.5, policy_servers.write, path, new)
    assert servers.up_for(1) == new
    timer.join()


def test_a_stop_a_trainer_given_up_on_a_timeout_and_a_bad_file_end_the_wait(
    tmp_path: Path,
) -> None:
    path = tmp_path / policy_servers.FILE
    stopped = threading.Event()
    stopped.set()
    assert servers_of(path, Trainer(), stop=stopped).up_for(0) is None
    assert servers_of(path, Trainer(), stop=stopped).trained(0) is None
    dead = Trainer()
    dead.code, dead.given_up = 1, True
    with pytest.raises(RuntimeError, match="the trainer stopped before its servers were up"):
        servers_of(path, dead).up_for(0)
    with pytest.raises(RuntimeError, match="before it trained on iteration 1"):
        servers_of(path, dead).trained(0)
    with pytest.raises(TimeoutError, match=r"after 0\.6 s waiting until its servers were up"):
        servers_of(path, Trainer(), timeout=0.6).up_for(0)
    path.write_text('{"step": 1, "addresses": "10.0.0.5:1"}')
    with pytest.raises(policy_servers.EnginesError, match="addresses must be a non-empty list"):
        servers_of(path, Trainer()).up_for(0)
