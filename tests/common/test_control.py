"""The control token: made once, private, and checked whole."""

from __future__ import annotations

from pathlib import Path

import pytest
from openforge import control


def test_the_token_is_made_once_private_and_then_read(tmp_path: Path) -> None:
    path = tmp_path / "own" / "control-token"
    token = control.ensure(path)
    assert len(token) >= 40 and path.stat().st_mode & 0o777 == 0o600
    assert control.ensure(path) == token == control.read(path)  # a restarted sidecar keeps it
    assert not list(path.parent.glob("*.partial"))


def test_only_the_whole_token_is_allowed() -> None:
    assert control.allows("abc", control.headers("abc")[control.HEADER])
    for value in (None, "", "Bearer ab", "Bearer abcd", "abc", "Basic abc"):
        assert not control.allows("abc", value), value


def test_an_empty_token_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("\n")
    with pytest.raises(ValueError, match="empty control token file"):
        control.read(tmp_path / "t")
