"""Make this folder's shared helper (``learning_runs``) importable.

Tests run with ``--import-mode=importlib``, which puts no test folder on
``sys.path``; the two learning tests share how they run and read a run
through it.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
