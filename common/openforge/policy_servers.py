"""Where the policy's servers are when the trainer runs them: the engines file.

With veRL's own vLLM servers (``openforge train-verl --rollout vllm``) the trainer starts
the servers the sidecars must call, on addresses it picks, and wakes them with the
newest weights for each step's rollout phase. The trainer writes where they are, with
the step, to ``{run_dir}/engines.json`` in that phase; the runner that starts the
harnesses (``openforge run``) reads step *s*, points iteration *s* - 1's sidecars at
``http://host:port`` and knows the servers hold the weights after step *s* - 1. The
trainer writes it (``openforge_trainer.training.verl_engines``), the runner reads it:
this module is the format both follow.

One JSON object, replaced whole (written beside, then renamed)::

    {"step": 3, "addresses": ["10.0.0.5:41234", "10.0.0.6:39001"]}
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FILE = "engines.json"
ROLLOUT_OPTION = "actor_rollout_ref.rollout.name"
"""The veRL key that picks who serves the sidecars; ``vllm``: veRL's own servers."""


def trainer_serves(options: Mapping[str, Any]) -> bool:
    """Whether veRL options (a RolloutJob's ``spec.training.options``) ask for veRL's own
    vLLM servers, read as ``openforge train-verl`` reads them (Hydra's ``+``/``~`` and
    spaces around the key ignored)."""
    return any(
        key.strip().lstrip("+~") == ROLLOUT_OPTION and value == "vllm"
        for key, value in options.items()
    )


class EnginesError(ValueError):
    """The engines file, or what veRL said, is not what it should be (the message names it)."""


@dataclasses.dataclass(frozen=True)
class Engines:
    step: int  # veRL's step whose rollout phase the servers are awake for
    addresses: tuple[str, ...]  # host:port of each server, as veRL's load balancer has them

    @property
    def iteration(self) -> int:
        """The iteration whose rollouts the servers serve: veRL's step - 1 (the policy
        version of their weights)."""
        return self.step - 1

    def endpoints(self) -> list[str]:
        """The servers as a sidecar's ``--engine`` takes them."""
        return [f"http://{address}" for address in self.addresses]


def parse(text: str, *, source: str) -> Engines:
    """The engines ``text`` (the file's content) names; a bad field is named with ``source``."""
    try:
        raw: Any = json.loads(text)
    except ValueError as exc:
        raise EnginesError(f"{source}: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise EnginesError(f"{source}: a JSON object with step and addresses, not {raw!r}")
    step = raw.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise EnginesError(f"{source}: step must be an integer >= 1, not {step!r}")
    return Engines(step=step, addresses=_addresses(raw.get("addresses"), source=source))


def _addresses(value: Any, *, source: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise EnginesError(f"{source}: addresses must be a non-empty list, not {value!r}")
    for index, address in enumerate(value):
        host, sep, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
        if not (host and sep and port.isdigit() and 0 < int(port) < 65536) or "/" in host:
            raise EnginesError(f"{source}: addresses[{index}] must be host:port, not {address!r}")
    return tuple(value)


def read(path: Path) -> Engines | None:
    """The engines in ``path``, or None while veRL has written none."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return parse(text, source=str(path))


def write(path: Path, engines: Engines) -> None:
    """Replace ``path`` with ``engines`` (a reader sees the old file or the new, whole)."""
    if engines.step < 1:
        raise EnginesError(f"step must be an integer >= 1, not {engines.step!r}")
    _addresses(list(engines.addresses), source="veRL's load balancer")
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps({"step": engines.step, "addresses": list(engines.addresses)}))
    partial.replace(path)
