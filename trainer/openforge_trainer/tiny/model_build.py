"""Build a tiny Qwen2 policy from a seed, offline.

No machine here reaches a model hub, and a CPU demo needs a policy that
generates and trains in seconds, so we initialise a small
``Qwen2ForCausalLM`` ourselves: the architecture and weight layout of the
Qwen2.5 family (so ``AutoModelForCausalLM``, vLLM and veRL load it like any
Qwen2 checkpoint), the tiny tokenizer's vocabulary, tied embeddings. The
build is a pure function of the seed: the same seed gives the same weights,
bit for bit.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from openforge_trainer.tiny import tokenizer_build


@dataclass(frozen=True, slots=True)
class ModelSize:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int


# "tiny" is sized for CPU: 1.1M parameters (0.5M of them the tied embedding), 4.3 MiB.
SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(hidden=128, layers=3, heads=4, kv_heads=2, intermediate=384),
    "small": ModelSize(hidden=256, layers=4, heads=8, kv_heads=4, intermediate=768),
}
MAX_POSITIONS = 4096


def tokenizer_config() -> dict[str, Any]:
    path = tokenizer_build.committed_assets() / "tokenizer_config.json"
    config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return config


def model_config(size: str = "tiny") -> Qwen2Config:
    """The Qwen2 configuration of a named size, with the tiny tokenizer's token ids."""
    if size not in SIZES:
        raise ValueError(f"size: {size!r} is not one of {sorted(SIZES)}")
    shape = SIZES[size]
    vocab = _token_ids()
    return Qwen2Config(
        vocab_size=tokenizer_build.VOCAB_SIZE,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=vocab[tokenizer_build.EOS_TOKEN],
        pad_token_id=vocab[tokenizer_build.PAD_TOKEN],
        dtype="float32",
    )


def build_model(out_dir: Path, *, seed: int, size: str = "tiny") -> Path:
    """Initialise the model from ``seed`` and save it, with the tokenizer, into ``out_dir``."""
    config = model_config(size)
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)  # type: ignore[no-untyped-call]
    finally:
        torch.random.set_rng_state(generator_state)
    save_model(model, out_dir)
    return out_dir


def load_model(model_dir: Path) -> PreTrainedModel:
    """A saved policy, in float32 and eval mode, on the CPU."""
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.nn.Module.train(model, False)
    return model


def save_model(model: PreTrainedModel, out_dir: Path) -> None:
    """Save weights (safetensors), config and generation config, plus the tokenizer files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    copy_tokenizer(out_dir)


def copy_tokenizer(out_dir: Path) -> None:
    for source in sorted(tokenizer_build.committed_assets().iterdir()):
        shutil.copyfile(source, out_dir / source.name)


def _token_ids() -> dict[str, int]:
    decoder = tokenizer_config()["added_tokens_decoder"]
    return {entry["content"]: int(index) for index, entry in decoder.items()}
