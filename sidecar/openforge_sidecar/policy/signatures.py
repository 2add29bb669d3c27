"""Signatures on the policy's own thinking, so that it round-trips as thinking.

Anthropic's thinking blocks carry a ``signature``; clients replay a signed
block as it was, and some turn an unsigned one (``"signature": ""``) into a
plain text block, which then merges into no history and shows the model's
reasoning as ordinary text in the trained prompt. The sidecar therefore signs
every block of reasoning it relays: a keyed MAC of the block's text, under a
key kept in the rollout's spool directory (so a sidecar restarted on the spool
still verifies what it signed before).

A replayed block whose signature is one of ours must match its text: an
edited or forged block is refused, as the real API refuses it. A signature
that is not ours (another upstream's, or none) is taken as it is: the
verdict is only about what this sidecar signed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from openforge.wire import conversation

PREFIX = "ofs1."
KEY_FILE = "thinking-signing.key"
KEY_BYTES = 32


class Signer:
    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError(f"a signing key needs 16 bytes at least, not {len(key)}")
        self._key = key

    @classmethod
    def in_directory(cls, directory: Path) -> Signer:
        """The key in ``directory`` (:data:`KEY_FILE`), made (0600, random) when absent."""
        path = directory / KEY_FILE
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return cls(path.read_bytes())
        key = secrets.token_bytes(KEY_BYTES)
        with os.fdopen(descriptor, "wb") as out:
            out.write(key)
            out.flush()
            os.fsync(out.fileno())
        return cls(key)

    def sign(self, text: str) -> str:
        digest = hmac.new(self._key, text.encode(), hashlib.sha256).digest()
        return PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def forged(self, request: conversation.ChatRequest) -> int | None:
        """The position (from 0, among the request's reasoning parts) of the first
        block that carries one of our signatures and does not match its text."""
        position = 0
        for message in request.messages:
            for part in message.parts:
                if not isinstance(part, conversation.ReasoningPart):
                    continue
                signature = part.signature or ""
                if signature.startswith(PREFIX) and not hmac.compare_digest(
                    signature, self.sign(part.text)
                ):
                    return position
                position += 1
        return None
