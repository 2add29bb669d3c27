"""Make this folder's shared helper (``tiny_policy``) importable.

Tests run with ``--import-mode=importlib``, which puts no test folder on
``sys.path``. Tests here exercise the sidecar package alone; a real sidecar
with a real collector and its store is tested in ``tests/capture``.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
