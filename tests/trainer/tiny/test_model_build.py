"""The tiny offline policy: built from a seed, loadable as any Qwen2 checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from openforge_trainer.tiny import cli as model_cli
from openforge_trainer.tiny import model_build, tokenizer_build
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_build.build_model(tmp_path_factory.mktemp("m") / "seed0", seed=0)


def test_same_seed_same_bytes_other_seed_other_weights(built: Path, tmp_path: Path) -> None:
    again = model_build.build_model(tmp_path / "again", seed=0)
    other = model_build.build_model(tmp_path / "other", seed=1)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (again / name).read_bytes() == (built / name).read_bytes(), name
    assert (other / "model.safetensors").read_bytes() != (built / "model.safetensors").read_bytes()


def test_the_build_leaves_the_global_torch_seed_alone(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    model_build.build_model(tmp_path, seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_loads_as_qwen2_with_the_tokenizers_vocabulary(built: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(built)
    tokenizer = Tokenizer.from_file(str(built / "tokenizer.json"))
    assert model.config.model_type == "qwen2"
    assert (
        model.config.vocab_size
        == tokenizer.get_vocab_size(with_added_tokens=True)
        == tokenizer_build.VOCAB_SIZE
    )
    assert model.config.eos_token_id == tokenizer.token_to_id("<|im_end|>")
    assert model.config.pad_token_id == tokenizer.token_to_id("<|endoftext|>")
    assert model.config.tie_word_embeddings
    assert (
        model.get_output_embeddings().weight.data_ptr()
        == model.get_input_embeddings().weight.data_ptr()
    )
    ids = torch.tensor([tokenizer.encode("<|im_start|>user\nhi<|im_end|>").ids])
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], tokenizer_build.VOCAB_SIZE)


def test_small_enough_for_cpu_and_for_the_repository(built: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(built)
    assert sum(p.numel() for p in model.parameters()) < 1_500_000
    assert (built / "model.safetensors").stat().st_size < 5 * 2**20


def test_tokenizer_files_are_the_committed_ones(built: Path) -> None:
    for source in tokenizer_build.committed_assets().iterdir():
        assert (built / source.name).read_bytes() == source.read_bytes()
    config = json.loads((built / "tokenizer_config.json").read_text())
    assert config["chat_template"] == tokenizer_build.CHAT_TEMPLATE


def test_unknown_size_is_named() -> None:
    with pytest.raises(ValueError, match="size: 'huge' is not one of"):
        model_build.model_config("huge")


def test_cli_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert model_cli.main(["build", "--out", str(tmp_path / "cli"), "--seed", "0"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli")
    assert (tmp_path / "cli" / "model.safetensors").is_file()
