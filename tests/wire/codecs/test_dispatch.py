"""Which codec serves a path, and that only the codecs in use are imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from openforge.wire import codecs


def test_the_suffix_table_is_each_codec_s_own_paths() -> None:
    by_module = {name: suffix for suffix, name in codecs.SUFFIXES}
    for codec in codecs.all_codecs():
        module = type(codec).__module__.rsplit(".", 1)[1]
        if module == "gemini":
            assert set(codec.paths) | {":countTokens"} == set(codecs.GEMINI_METHODS)
        else:
            assert codec.paths == (by_module[module],)


def test_a_codec_module_is_imported_when_a_request_first_needs_it() -> None:
    probe = """
import json, sys
from openforge_sidecar import capture
from openforge.wire import codecs
loaded = lambda: sorted(
    m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("openforge.wire.codecs.")
)
before = loaded()
codecs.for_path("/v1/chat/completions"); codecs.counter_for_path("/v1/chat/completions")
chat = loaded()
codecs.for_path("/v1beta/models/m:generateContent?alt=sse")
print(json.dumps([before, chat, loaded()]))
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    before, chat, gemini = json.loads(done.stdout)
    codec_modules = {"openai_chat", "openai_responses", "anthropic_messages", "gemini"}
    assert not codec_modules & set(before)
    assert codec_modules & set(chat) == {"openai_chat"}
    assert codec_modules & set(gemini) == {"openai_chat", "gemini"}


HARNESS_REQUESTS = Path(__file__).resolve().parents[2] / "fixtures" / "harness_requests"


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param(entry, id=f"{harness.name}/{entry['file']}")
        for harness in sorted(HARNESS_REQUESTS.iterdir())
        for entry in json.loads((harness / "index.json").read_text())
    ],
)
def test_every_captured_harness_request_is_accepted(entry: dict[str, Any]) -> None:
    """Real harnesses' requests (Codex's ``namespace`` tools, Claude Code's thinking,
    ...) pass the codecs' validation: a value the codecs refuse must be one no real
    API takes, never one a real harness sends."""
    harness = next(d for d in HARNESS_REQUESTS.iterdir() if (d / entry["file"]).exists())
    path = entry["path"] + (f"?{entry['query']}" if entry.get("query") else "")
    codec = codecs.for_path(path)
    assert codec is not None, path
    request = codec.parse_request((harness / entry["file"]).read_bytes())
    assert request.messages
