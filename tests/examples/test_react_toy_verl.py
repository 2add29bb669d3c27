"""examples/react-toy-verl.yaml: the README's demo, trained by veRL's Ray trainer.

It must stay the demo with only ``spec.training`` changed, so that a run of it
compares the two engines on the same rollouts; it runs for real in
tests/runner/test_verl_engine.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openforge.api import manifests, v1alpha1

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _objects(name: str) -> dict[str, dict[str, Any]]:
    loaded = manifests.load_manifests(EXAMPLES / name)
    return {f"{r.kind}/{r.metadata.name}": r.to_dict() for r in loaded}


def test_it_is_the_react_demo_with_only_its_training_changed() -> None:
    demo, verl = _objects("react-toy.yaml"), _objects("react-toy-verl.yaml")
    assert demo.keys() == verl.keys()
    demo_training = demo["RolloutJob/react-toy"]["spec"].pop("training")
    verl_training = verl["RolloutJob/react-toy"]["spec"].pop("training")
    assert demo == verl
    assert verl_training["engine"] == "verl"
    # the same steps, learning rate and seed; the options are veRL's keys
    for key in ("iterations", "learningRate", "seed"):
        assert verl_training[key] == demo_training[key]
    assert all("." in key for key in verl_training["options"])


def test_its_training_section_is_valid() -> None:
    (job,) = [
        r
        for r in manifests.load_manifests(EXAMPLES / "react-toy-verl.yaml")
        if isinstance(r, v1alpha1.RolloutJob)
    ]
    assert job.spec.training is not None and job.spec.training.engine == "verl"
