"""The policy's weights: load a Hugging Face checkpoint, and swap tensors in place.

``openforge serve`` loads a ``save_pretrained`` directory with transformers'
``AutoModelForCausalLM`` and later receives new weights from the trainer,
either as a path (a checkpoint directory or one ``.safetensors`` file) or as
the bytes of a safetensors-serialized state dict. :func:`plan` checks every
incoming tensor against the model *before* anything is copied, so a bad
update is refused whole (the error names the tensor) and the served weights
are never half old, half new; :func:`apply` then copies in place, keeping the
parameter objects (and so any reference the scheduler holds) alive.

Tied weights (``tie_word_embeddings``: ``lm_head.weight`` is
``model.embed_tokens.weight``) are one tensor under two names;
``save_pretrained`` writes only one of them, so either name covers both.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors import torch as safetensors_torch
from transformers import AutoModelForCausalLM, PreTrainedModel

SINGLE_FILE = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class WeightsError(ValueError):
    """Weights that cannot be loaded or do not fit the served model."""


@dataclass(frozen=True, slots=True)
class Plan:
    """Checked pairs of (model parameter, incoming tensor), ready to copy."""

    pairs: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    names: tuple[str, ...]


def load_model(directory: Path, *, device: str = "cpu", dtype: str = "float32") -> PreTrainedModel:
    """A causal LM from a ``save_pretrained`` directory, in eval mode, gradients off."""
    if dtype not in DTYPES:
        raise WeightsError(f"dtype: must be one of {sorted(DTYPES)}, got {dtype!r}")
    if not (directory / "config.json").is_file():
        raise WeightsError(f"model directory {directory} has no config.json")
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(directory, dtype=DTYPES[dtype])
    torch.nn.Module.to(model, torch.device(device))
    torch.nn.Module.train(model, False)
    model.requires_grad_(False)
    return model


def read_path(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint directory (single file or sharded) or a ``.safetensors`` file."""
    if path.is_file():
        return _read_file(path)
    if not path.is_dir():
        raise WeightsError(f"path: {path} is neither a checkpoint directory nor a file")
    if (path / SINGLE_FILE).is_file():
        return _read_file(path / SINGLE_FILE)
    if (path / SHARD_INDEX).is_file():
        return _read_shards(path)
    raise WeightsError(f"path: {path} holds neither {SINGLE_FILE} nor {SHARD_INDEX}")


def read_bytes(data: bytes) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors-serialized state dict."""
    if not data:
        raise WeightsError("the request body is empty; expected a safetensors state dict")
    try:
        return dict(safetensors_torch.load(data))
    except (SafetensorError, ValueError) as error:
        raise WeightsError(f"the request body is not a safetensors file: {error}") from error


def plan(
    model: torch.nn.Module, tensors: dict[str, torch.Tensor], *, partial: bool = False
) -> Plan:
    """Match incoming tensors to the model's by name and shape; refuse any mismatch.

    Unless ``partial``, every model tensor must be covered (a tied pair by
    either of its names), so a truncated checkpoint cannot leave stale
    weights behind silently.
    """
    if not tensors:
        raise WeightsError("the update holds no tensors")
    targets = model.state_dict(keep_vars=True)
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    for name in sorted(tensors):
        target = targets.get(name)
        if target is None:
            raise WeightsError(f"tensor {name}: the served model has no tensor of that name")
        incoming = tensors[name]
        if tuple(incoming.shape) != tuple(target.shape):
            raise WeightsError(
                f"tensor {name}: shape {list(incoming.shape)} does not match the served "
                f"model's {list(target.shape)}"
            )
        if incoming.is_floating_point() != target.is_floating_point():
            raise WeightsError(
                f"tensor {name}: dtype {incoming.dtype} cannot replace {target.dtype}"
            )
        pairs.append((target, incoming))
    if not partial:
        _check_complete(targets, set(tensors))
    return Plan(tuple(pairs), tuple(sorted(tensors)))


def apply(update: Plan) -> None:
    """Copy the planned tensors into the model's parameters, in place."""
    with torch.no_grad():
        for target, incoming in update.pairs:
            target.copy_(incoming.to(device=target.device, dtype=target.dtype))


def timed_read(source: Path | bytes) -> tuple[dict[str, torch.Tensor], float]:
    """Read tensors from a path or bytes; also return the milliseconds it took."""
    start = time.perf_counter()
    tensors = read_path(source) if isinstance(source, Path) else read_bytes(source)
    return tensors, (time.perf_counter() - start) * 1000.0


def _check_complete(targets: dict[str, torch.Tensor], names: set[str]) -> None:
    groups: dict[int, list[str]] = {}
    for name, tensor in targets.items():
        groups.setdefault(id(tensor), []).append(name)
    missing = sorted(group[0] for group in groups.values() if not names.intersection(group))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WeightsError(
            f"tensor {missing[0]}: missing from the update{more}; "
            "send every tensor, or set partial to update a subset"
        )


def _read_file(path: Path) -> dict[str, torch.Tensor]:
    try:
        return dict(safetensors_torch.load_file(str(path)))
    except (SafetensorError, ValueError, OSError) as error:
        raise WeightsError(f"path: {path} is not a readable safetensors file: {error}") from error


def _read_shards(directory: Path) -> dict[str, torch.Tensor]:
    try:
        index = json.loads((directory / SHARD_INDEX).read_text())
        weight_map = index["weight_map"]
    except (ValueError, KeyError, TypeError) as error:
        raise WeightsError(
            f"path: {directory / SHARD_INDEX} is not a shard index: {error}"
        ) from error
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        tensors.update(_read_file(directory / shard))
    return tensors
