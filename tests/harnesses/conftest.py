"""Fixtures for the real-harness tests: installed CLIs and a capture stack.

Tests run with ``--import-mode=importlib``, which puts no test folder on
``sys.path``; this folder's shared helpers (``harness_stack``) are made
importable here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import harness_stack  # noqa: E402


@pytest.fixture(scope="session")
def harness_bins() -> harness_stack.HarnessBins:
    return harness_stack.HarnessBins.from_environment()


@pytest.fixture
def capture_stack(procs: Any, tmp_path: Path) -> Callable[[str], harness_stack.CaptureStack]:
    """Start a stack for one harness's rollout: ``capture_stack("codex")``."""

    def start(harness: str) -> harness_stack.CaptureStack:
        engine = procs.engine()
        collector = procs.collector()
        rollout_id = f"{harness}-rollout"
        sidecar = procs.sidecar(
            "--collector", f"127.0.0.1:{collector.port}", "--job", "harness-e2e",
            "--rollout-id", rollout_id, "--task-id", "hello-txt", "--harness", harness,
            engine=engine,
        )  # fmt: skip
        return harness_stack.CaptureStack(
            engine, collector, sidecar, tmp_path / "store.db", rollout_id
        )

    return start
