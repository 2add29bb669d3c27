"""The policy served by the trainer itself: veRL's own vLLM servers (GPUs only).

Then no ``openforge serve`` runs. For its step *s* veRL wakes its servers with the weights
after step *s* - 1 and writes where they are to its engines file
(:mod:`openforge.policy_servers`): iteration *s* - 1's rollouts go to them. For
``openforge run`` this reads that file and the trainer's process: where an iteration's
servers are, and when an iteration is trained.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from openforge import policy_servers

from openforge_runner import runner


@dataclass
class TrainerServers:
    path: Path  # the trainer's engines file
    exit_code: Callable[[], int | None]  # the trainer process's (None while it runs)
    alive: Callable[[], bool]  # it runs or is being restarted (its supervisor's view)
    stop: threading.Event
    timeout: float = 1800.0

    def forget(self) -> None:
        """A trainer (re)starts: the servers the file names were its predecessor's, gone."""
        self.path.unlink(missing_ok=True)

    def finished(self) -> bool:
        """The trainer trained its last step and exited."""
        return self.exit_code() == 0

    def up_for(self, iteration: int) -> policy_servers.Engines | None:
        """The servers for ``iteration``'s rollouts, once up (the file names step
        ``iteration + 1`` or a later one); None when stopped, or once the trainer has
        finished (it trained every step: nothing is left to serve)."""
        found = self._poll(
            lambda: self._at(iteration + 1) or self.finished() or None,
            what=f"its servers were up for iteration {iteration + 1}",
        )
        return found if isinstance(found, policy_servers.Engines) else None

    def trained(self, iteration: int) -> int | None:
        """The policy version after the trainer's step on ``iteration`` (``iteration + 1``)
        once that step is done: its servers are up for the next iteration, or it finished;
        None when stopped."""
        done = self._poll(
            lambda: self._at(iteration + 2) is not None or self.finished() or None,
            what=f"it trained on iteration {iteration + 1}",
        )
        return None if done is None else iteration + 1

    def _at(self, step: int) -> policy_servers.Engines | None:
        engines = policy_servers.read(self.path)
        return engines if engines is not None and engines.step >= step else None

    def _poll(self, ready: Callable[[], object | None], *, what: str) -> object | None:
        """:func:`runner.poll_until` on the trainer. A trainer given up on, or a file that is
        not what it should be (the field named), is an error."""
        return runner.poll_until(
            ready,
            alive=self.alive,
            stop=self.stop,
            timeout=self.timeout,
            died=f"the trainer stopped before {what} (see trainer.log)",
            late=f"gave up after {self.timeout:g} s waiting until {what}",
        )
