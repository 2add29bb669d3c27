"""veRL's side of the engines file: the agent loop asks veRL's own load balancer (a Ray actor
on a local Ray cluster) where its servers are, and writes them once a step."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from openforge import policy_servers
from openforge_trainer.training import verl_engines


def test_announced_once_a_step_from_what_veRLs_load_balancer_holds(
    tmp_path: Path, verl_client: Callable[[list[str]], Any]
) -> None:
    path = tmp_path / policy_servers.FILE
    client = verl_client(["10.0.0.5:41234", "10.0.0.6:39001"])

    async def steps() -> None:
        await asyncio.gather(*(verl_engines.announce(client, path, step=1) for _ in range(4)))
        assert json.loads(path.read_text()) == {
            "step": 1,
            "addresses": ["10.0.0.5:41234", "10.0.0.6:39001"],
        }
        path.unlink()
        await verl_engines.announce(client, path, step=1)
        assert not path.exists()  # once a step: a later call of step 1 writes nothing
        await verl_engines.announce(client, path, step=2)

    asyncio.run(steps())
    assert policy_servers.read(path) == policy_servers.Engines(
        step=2, addresses=("10.0.0.5:41234", "10.0.0.6:39001")
    )


def test_what_veRL_does_not_give_is_named(
    tmp_path: Path, verl_client: Callable[[list[str]], Any]
) -> None:
    path = tmp_path / policy_servers.FILE
    with pytest.raises(policy_servers.EnginesError, match="no load balancer"):
        asyncio.run(verl_engines.announce(None, path, step=1))
    with pytest.raises(policy_servers.EnginesError, match=r"addresses\[0\] must be host:port"):
        asyncio.run(verl_engines.announce(verl_client(["no-port"]), path, step=1))
    assert not path.exists()
