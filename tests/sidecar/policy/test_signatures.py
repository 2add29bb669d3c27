"""Signatures on the policy's own thinking (openforge_sidecar.policy.signatures)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from openforge.wire import conversation as conv
from openforge_sidecar.policy import signatures


def request(*parts: conv.Part) -> conv.ChatRequest:
    return conv.ChatRequest(
        api=conv.WireApi.ANTHROPIC_MESSAGES,
        model="m",
        messages=(conv.Message("user", (conv.TextPart("hi"),)), conv.Message("assistant", parts)),
    )


def test_the_key_is_made_once_per_spool_and_kept(tmp_path: Path) -> None:
    first = signatures.Signer.in_directory(tmp_path)
    key = tmp_path / signatures.KEY_FILE
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
    again = signatures.Signer.in_directory(tmp_path)  # a sidecar restarted on the spool
    assert again.sign("thought") == first.sign("thought") != first.sign("thought!")
    other = signatures.Signer.in_directory(tmp_path / "..")  # another rollout's spool
    assert other.sign("thought") != first.sign("thought")


def test_only_our_own_signature_on_other_text_is_forged(tmp_path: Path) -> None:
    signer = signatures.Signer.in_directory(tmp_path)
    ours = signer.sign("I think so.")
    assert ours.startswith(signatures.PREFIX)
    assert signer.forged(request(conv.ReasoningPart("I think so.", ours))) is None
    assert signer.forged(request(conv.ReasoningPart("I think so.", None))) is None  # unsigned
    assert (
        signer.forged(request(conv.ReasoningPart("x", "EqQBCkgIAhABGAIiQL"))) is None
    )  # another's
    edited = request(
        conv.ReasoningPart("I think so.", ours),
        conv.TextPart("ok"),
        conv.ReasoningPart("I know.", ours),
    )
    assert signer.forged(edited) == 1


def test_a_short_key_is_refused() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        signatures.Signer(b"short")
