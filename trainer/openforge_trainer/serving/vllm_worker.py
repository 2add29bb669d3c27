"""A vLLM worker extension that loads a checkpoint directory's weights in place.

Start vLLM with::

    VLLM_SERVER_DEV_MODE=1 vllm serve <model> \\
        --worker-extension-cls openforge_trainer.serving.vllm_worker.WeightLoader

and :class:`openforge_trainer.serving.publish.VLLMPublisher` calls
``update_weights_from_path`` on every worker through ``POST /collective_rpc``.
vLLM mixes the extension's methods into its GPU worker, so ``self`` there
is the worker (``self.model_runner.model`` is the loaded model, whose
``load_weights`` takes Hugging Face names and shards them itself).

Not run in this repository's tests (no GPU, no vLLM): only
:func:`checkpoint_weights`, the reading half, is tested on CPU.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch


def checkpoint_weights(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a checkpoint directory's ``*.safetensors`` files, by name."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                yield name, handle.get_tensor(name)


class WeightLoader:
    """Methods vLLM adds to its workers (``--worker-extension-cls``)."""

    def update_weights_from_path(self: Any, path: str) -> dict[str, Any]:
        loader_utils = importlib.import_module("vllm.model_executor.model_loader.utils")
        model = self.model_runner.model
        loaded = model.load_weights(checkpoint_weights(path))
        device = next(model.parameters()).device
        loader_utils.process_weights_after_loading(model, self.model_runner.model_config, device)
        return {"path": path, "loaded": len(loaded) if loaded is not None else None}
