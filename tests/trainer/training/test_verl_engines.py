"""Where veRL's own vLLM servers are (``run_dir/engines.json``): written by the agent loop
from veRL's load balancer each step, read by the runner that starts the harnesses."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from openforge_trainer.training import verl_engines


def test_written_whole_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / verl_engines.FILE
    assert verl_engines.read(path) is None  # veRL has written none yet
    engines = verl_engines.Engines(step=3, addresses=("10.0.0.5:41234", "[fd00::1]:9000"))
    verl_engines.write(path, engines)
    assert verl_engines.read(path) == engines
    assert engines.endpoints() == ["http://10.0.0.5:41234", "http://[fd00::1]:9000"]
    assert [p.name for p in tmp_path.iterdir()] == [verl_engines.FILE]  # nothing left beside


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("{", "not JSON"),
        ("[1]", "a JSON object"),
        ('{"addresses": ["a:1"]}', "step must be an integer >= 1, not None"),
        ('{"step": 0, "addresses": ["a:1"]}', "step must be"),
        ('{"step": true, "addresses": ["a:1"]}', "step must be"),
        ('{"step": 1, "addresses": []}', "addresses must be a non-empty list"),
        ('{"step": 1, "addresses": ["a:1", "nohost"]}', r"addresses\[1\] must be host:port"),
        ('{"step": 1, "addresses": ["a:99999"]}', r"addresses\[0\]"),
        ('{"step": 1, "addresses": ["http://a:1"]}', r"addresses\[0\]"),
        ('{"step": 1, "addresses": [7]}', r"addresses\[0\]"),
    ],
)
def test_a_bad_file_is_refused_naming_the_field(tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / verl_engines.FILE
    path.write_text(text)
    with pytest.raises(verl_engines.EnginesError, match=named) as caught:
        verl_engines.read(path)
    assert str(path) in str(caught.value)


def test_announced_once_a_step_from_what_veRLs_load_balancer_holds(
    tmp_path: Path, verl_client: Callable[[list[str]], Any]
) -> None:
    path = tmp_path / verl_engines.FILE
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
    assert verl_engines.read(path) == verl_engines.Engines(
        step=2, addresses=("10.0.0.5:41234", "10.0.0.6:39001")
    )


def test_what_veRL_does_not_give_is_named(
    tmp_path: Path, verl_client: Callable[[list[str]], Any]
) -> None:
    path = tmp_path / verl_engines.FILE
    with pytest.raises(verl_engines.EnginesError, match="no load balancer"):
        asyncio.run(verl_engines.announce(None, path, step=1))
    with pytest.raises(verl_engines.EnginesError, match=r"addresses\[0\] must be host:port"):
        asyncio.run(verl_engines.announce(verl_client(["no-port"]), path, step=1))
    assert not path.exists()
