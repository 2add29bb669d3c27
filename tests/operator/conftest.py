"""Unit tests of the operator's pure modules; ``operator_fixtures`` builds their inputs.

Tests run with ``--import-mode=importlib``, which puts no test folder on
``sys.path``; this folder is added so the test modules share the builders.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
