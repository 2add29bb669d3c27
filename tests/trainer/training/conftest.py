"""What veRL gives an agent loop, for the tests of this folder that need it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from omegaconf import OmegaConf


@pytest.fixture(scope="session")
def verl_client() -> Iterator[Callable[[list[str]], Any]]:
    """Makes veRL's own ``LLMServerClient`` over veRL's own load balancer (a Ray actor on a
    local Ray cluster, started once) holding the given server addresses: the
    ``server_manager`` veRL hands each agent loop. No server runs behind the addresses."""
    import ray
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        yield lambda addresses: LLMServerClient(
            OmegaConf.create({}), load_balancer_handle=get_router_handle(dict.fromkeys(addresses))
        )
    finally:
        ray.shutdown()
