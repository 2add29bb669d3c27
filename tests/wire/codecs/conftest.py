"""Make the shared ``codec_strategies`` module importable.

Tests run with ``--import-mode=importlib``, which puts no test folder on
``sys.path``; the codec tests share their strategies through this folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
