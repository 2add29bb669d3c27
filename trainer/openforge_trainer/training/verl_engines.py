"""veRL's side of the engines file (:mod:`openforge.policy_servers`): where veRL's own vLLM
servers are, asked of veRL in each step's rollout phase.

With ``openforge train-verl --rollout vllm`` veRL starts vLLM servers of its own (its
hybrid engine: they share the actor workers' GPUs, sleep while the actors train, and are
woken with the newest weights for each step's rollout phase). Only veRL knows where they
are: its ``LLMServerManager`` starts them on addresses (``host:port``) it picks. The
OpenForge agent loop, which veRL calls in each step's rollout phase, asks veRL's load
balancer for them (:func:`announce`) and writes them to ``{run_dir}/engines.json``
with the step, for the runner that starts the harnesses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openforge import policy_servers


async def from_verl(server_manager: Any, *, step: int) -> policy_servers.Engines:
    """The servers veRL's agent loops are given this step: the addresses its load balancer
    holds (``LLMServerClient``'s balancer actor, ``get_all_servers``: veRL 0.9.1's)."""
    balancer = getattr(server_manager, "_load_balancer", None)
    if balancer is None:
        raise policy_servers.EnginesError(
            "veRL gave the agent loop no load balancer to ask for its servers' addresses "
            "(is actor_rollout_ref.rollout.name vllm?)"
        )
    addresses = await balancer.get_all_servers.remote()
    return policy_servers.Engines(step=step, addresses=tuple(addresses))


_announced: set[tuple[Path, int]] = set()


async def announce(server_manager: Any, path: Path, *, step: int) -> None:
    """Write the step's servers to ``path`` for each step (every agent loop of the step
    calls this; once one has written, the step's later calls do nothing; the first calls,
    running together, may each write the same file)."""
    if (path, step) in _announced:
        return
    engines = await from_verl(server_manager, step=step)
    policy_servers.write(path, engines)
    _announced.add((path, step))
