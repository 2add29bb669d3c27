"""The committed generated code is exactly what the pinned generator makes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "common" / "openforge" / "trajectory" / "v1"


def load_generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_regenerating_the_protos_changes_nothing(tmp_path: Path) -> None:
    generator = load_generator()
    generator.generate(tmp_path)
    out = tmp_path / "openforge" / "trajectory" / "v1"
    names = sorted(p.name for p in out.iterdir())
    assert names == ["trajectory_pb2.py", "trajectory_pb2.pyi", "trajectory_pb2_grpc.py"]
    for name in names:
        assert (out / name).read_text() == (GENERATED / name).read_text(), (
            f"{name} is stale: run scripts/gen_protos.py"
        )


def test_generated_grpc_module_imports_its_messages_as_a_package() -> None:
    text = (GENERATED / "trajectory_pb2_grpc.py").read_text()
    assert "from openforge.trajectory.v1 import trajectory_pb2" in text


@pytest.mark.parametrize(
    "module",
    ["openforge.trajectory.v1.trajectory_pb2", "openforge.trajectory.v1.trajectory_pb2_grpc"],
)
def test_generated_modules_import(module: str) -> None:
    __import__(module)
    assert module in sys.modules
