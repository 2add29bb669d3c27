"""The engines file (``run_dir/engines.json``): where the trainer's own policy servers are,
written by the trainer each step, read by the runner that starts the harnesses."""

from __future__ import annotations

from pathlib import Path

import pytest
from openforge import policy_servers


def test_written_whole_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / policy_servers.FILE
    assert policy_servers.read(path) is None  # veRL has written none yet
    engines = policy_servers.Engines(step=3, addresses=("10.0.0.5:41234", "[fd00::1]:9000"))
    policy_servers.write(path, engines)
    assert policy_servers.read(path) == engines
    assert engines.endpoints() == ["http://10.0.0.5:41234", "http://[fd00::1]:9000"]
    assert [p.name for p in tmp_path.iterdir()] == [policy_servers.FILE]  # nothing left beside


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
    path = tmp_path / policy_servers.FILE
    path.write_text(text)
    with pytest.raises(policy_servers.EnginesError, match=named) as caught:
        policy_servers.read(path)
    assert str(path) in str(caught.value)


def test_veRLs_own_servers_are_asked_for_by_the_rollout_option_as_veRL_reads_it() -> None:
    key = policy_servers.ROLLOUT_OPTION
    assert policy_servers.trainer_serves({key: "vllm", "trainer.device": "cuda"})
    assert policy_servers.trainer_serves({f" +{key}": "vllm"})  # Hydra's append, spaced
    assert not policy_servers.trainer_serves({key: "external"})
    assert not policy_servers.trainer_serves({"trainer.device": "cuda"})


def test_a_step_below_1_is_never_written(tmp_path: Path) -> None:
    with pytest.raises(policy_servers.EnginesError, match="step must be an integer >= 1"):
        policy_servers.write(tmp_path / "e.json", policy_servers.Engines(0, ("a:1",)))
    assert not (tmp_path / "e.json").exists()
