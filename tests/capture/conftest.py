"""Capture end to end: a real sidecar, a real collector and the store it writes.

These tests cross two components (the sidecar records, the trainer's collector
stores), so they live apart from ``tests/sidecar``, which tests the sidecar
package alone. This makes this folder's shared helpers (``scripted_engine``)
importable: tests run with ``--import-mode=importlib``, which puts no test folder
on ``sys.path``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import scripted_engine  # noqa: E402 (importable only once the folder is on the path)


@pytest.fixture
def engine() -> Iterator[scripted_engine.ScriptedEngine]:
    """A scripted engine on 127.0.0.1 (see scripted_engine), stopped after the test."""
    with scripted_engine.ScriptedEngine() as running:
        yield running
