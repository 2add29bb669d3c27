"""Deterministic ids in each API's style, derived from a seed by sha256.

Deterministic so that a replayed call yields byte-identical responses and so
that item ids inside one response can be rebuilt from its response id.
"""

from __future__ import annotations

import hashlib


def derive(prefix: str, seed: str, *, length: int = 24) -> str:
    """``prefix`` followed by ``length`` hex digits of sha256(seed)."""
    return prefix + hashlib.sha256(seed.encode()).hexdigest()[:length]


def item_id(prefix: str, response_id: str, *, index: int) -> str:
    """The id of output item ``index`` of response ``response_id``."""
    return derive(prefix, f"{response_id}/{index}", length=32)
