"""Real agent harnesses from npm, answered through the capture sidecar.

Codex CLI, Claude Code, OpenClaw and Gemini CLI (installed by
``scripts/install_harnesses.sh``) each get a one-tool-call task in a fresh
working directory, with their base URL pointed at a real sidecar (reverse
mode, tokens capture) in front of the deterministic test engine, and a real
collector behind it. The engine's script calls the harness's shell tool to
run the command, then answers "Done: <first line of the output>".

Each test checks that the harness succeeded and did the work, that every
call it made was captured without error and stored by the collector, that
every captured token is what the engine consumes and produces for that
prompt, and that the call after the tool result extends the first one's
tokens. Each harness runs in a clean environment (``env -i`` style): a
fresh HOME, its own config, stdin closed. See docs/harness-notes.md.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from harness_stack import CaptureStack, HarnessBins, check_extends, require_binary
from openforge_trainer.collection import store

pytestmark = pytest.mark.harness

TASK = "Please run `echo hi > hello.txt` and then say done."
API_KEY = "sk-openforge-dummy"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one harness run produced, and the calls it left in the store."""

    final_text: str
    calls: list[store.ModelCall]
    stats: dict[str, Any]
    tool_call: store.ModelCall  # the call that answered with the tool call
    follow_up: store.ModelCall  # the call that carried the tool result back


def base_path(*first: Path) -> str:
    """A minimal PATH: given directories, then the system's node and shell tools."""
    node = shutil.which("node")
    dirs = [str(d) for d in first]
    if node is not None:
        dirs.append(str(Path(node).parent))
    return ":".join(dict.fromkeys([*dirs, "/usr/bin", "/bin"]))


def run_harness(
    argv: list[str], *, env: dict[str, str], cwd: Path, timeout: float, stack: CaptureStack
) -> subprocess.CompletedProcess[str]:
    """Run a harness to completion; a non-zero exit fails with both sides' logs."""
    result = subprocess.run(
        argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    assert result.returncode == 0, (
        f"{Path(argv[0]).name} exited {result.returncode}\n--- stdout\n{result.stdout[-3000:]}"
        f"\n--- stderr\n{result.stderr[-3000:]}\n--- sidecar\n{stack.log_tail()}"
    )
    return result


def check_rollout(
    stack: CaptureStack, work: Path, final_text: str, *, merges: bool = True
) -> Outcome:
    """Everything a harness run must leave behind; returns it for harness-specific checks."""
    assert (work / "hello.txt").read_text().strip() == "hi"
    assert "Done" in final_text, final_text
    stats = stack.finish()
    calls = stack.calls()
    assert len(calls) == stats["calls"] >= 2, (len(calls), stats)
    assert [c.call_index for c in calls] == list(range(len(calls)))
    for call in calls:
        assert call.http_status == 200 and call.error == "", (call.call_index, call.error)
        stack.check_token_exact(call)
    tool_turn = next(i for i, c in enumerate(calls) if c.finish_reason == "tool_calls")
    first, follow_up = calls[tool_turn], calls[tool_turn + 1]
    if merges:
        check_extends(first, follow_up)
        assert stats["merge_rate"] == 1.0, stats
    return Outcome(final_text, calls, stats, first, follow_up)


# --- Codex CLI ----------------------------------------------------------------------

CODEX_CONFIG = """\
model = "policy"
model_provider = "openforge"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
model_reasoning_effort = "low"
web_search = "disabled"

[model_providers.openforge]
name = "openforge"
base_url = "{base_url}"
env_key = "OPENFORGE_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

[history]
persistence = "none"

[features]
plugins = false
remote_plugin = false
enable_request_compression = false
goals = false

[agents]
enabled = false
"""


def test_codex_cli(
    harness_bins: HarnessBins, capture_stack: Callable[[str], CaptureStack], tmp_path: Path
) -> None:
    codex = require_binary(harness_bins.codex, "Codex CLI")
    stack = capture_stack("codex")
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(CODEX_CONFIG.format(base_url=f"{stack.sidecar.url}/v1"))
    env = {
        "PATH": base_path(),
        "HOME": str(home),
        "CODEX_HOME": str(home),
        "OPENFORGE_API_KEY": API_KEY,
    }
    argv = [
        str(codex),
        "exec",
        "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox",
        TASK,
    ]
    result = run_harness(argv, env=env, cwd=work, timeout=120, stack=stack)
    outcome = check_rollout(stack, work, result.stdout)
    assert {c.wire_api for c in outcome.calls} == {"WIRE_API_OPENAI_RESPONSES"}
    assert all(c.stream for c in outcome.calls)
    first_request = json.loads(outcome.calls[0].request_json)
    assert any(t.get("name") == "exec_command" for t in first_request["tools"])


# --- Claude Code ---------------------------------------------------------------------


def test_claude_code(
    harness_bins: HarnessBins, capture_stack: Callable[[str], CaptureStack], tmp_path: Path
) -> None:
    claude = require_binary(harness_bins.claude, "Claude Code")
    stack = capture_stack("claude-code")
    home, work = tmp_path / "claude-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {
        "PATH": base_path(),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": stack.sidecar.url,
        "ANTHROPIC_API_KEY": API_KEY,
        "IS_SANDBOX": "1",  # allows --dangerously-skip-permissions as root
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    argv = [str(claude), "-p", TASK, "--output-format", "json", "--dangerously-skip-permissions"]
    result = run_harness(argv, env=env, cwd=work, timeout=120, stack=stack)
    answer = json.loads(result.stdout)
    assert answer["is_error"] is False, answer
    outcome = check_rollout(stack, work, answer["result"])
    assert {c.wire_api for c in outcome.calls} == {"WIRE_API_ANTHROPIC_MESSAGES"}
    # Claude Code's environment arrives as a system turn inside `messages`.
    roles = [m["role"] for m in json.loads(outcome.calls[0].request_json)["messages"]]
    assert "system" in roles


# --- OpenClaw ----------------------------------------------------------------------------

OPENCLAW_CONFIG = """\
{{
  update: {{ checkOnStart: false }},
  telemetry: {{ enabled: false }},
  agents: {{ defaults: {{ model: {{ primary: "openforge/policy" }} }} }},
  models: {{
    mode: "replace",
    providers: {{
      openforge: {{
        baseUrl: "{base_url}",
        apiKey: "{api_key}",
        api: "{api}",
        models: [
          {{ id: "policy", name: "Policy", reasoning: false, input: ["text"],
             cost: {{ input: 0, output: 0, cacheRead: 0, cacheWrite: 0 }},
             contextWindow: 32768, maxTokens: 4096 }},
        ],
      }},
    }},
  }},
}}
"""

# OpenClaw moves its internal-context user message to the end of the
# conversation on every call with these two APIs (not with Responses), so the
# follow-up rewrites the first call's history and starts a new segment.
_MOVES_CONTEXT = pytest.mark.slow


@pytest.mark.parametrize(
    ("api", "wire_api", "merges"),
    [
        pytest.param("openai-responses", "WIRE_API_OPENAI_RESPONSES", True, id="responses"),
        pytest.param(
            "openai-completions", "WIRE_API_OPENAI_CHAT", False, id="chat", marks=_MOVES_CONTEXT
        ),
        pytest.param(
            "anthropic-messages",
            "WIRE_API_ANTHROPIC_MESSAGES",
            False,
            id="anthropic",
            marks=_MOVES_CONTEXT,
        ),
    ],
)
def test_openclaw(
    harness_bins: HarnessBins,
    capture_stack: Callable[[str], CaptureStack],
    tmp_path: Path,
    api: str,
    wire_api: str,
    merges: bool,
) -> None:
    openclaw = require_binary(harness_bins.openclaw, "OpenClaw")
    require_binary(harness_bins.node24_bin_dir / "node", "Node 24 (for OpenClaw)")
    stack = capture_stack("openclaw")
    home, work = tmp_path / "openclaw-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    base_url = stack.sidecar.url if api == "anthropic-messages" else f"{stack.sidecar.url}/v1"
    config = tmp_path / "openclaw.json5"
    config.write_text(OPENCLAW_CONFIG.format(base_url=base_url, api_key=API_KEY, api=api))
    env = {
        "PATH": base_path(harness_bins.node24_bin_dir),
        "HOME": str(home),
        "OPENCLAW_NO_AUTO_UPDATE": "1",
        "DO_NOT_TRACK": "1",
    }
    argv = [str(openclaw), "agent", "exec", "--config", str(config), "--json", TASK]
    result = run_harness(argv, env=env, cwd=work, timeout=180, stack=stack)
    answer = json.loads(result.stdout)
    assert answer["ok"] is True and answer["toolSummary"]["calls"] == 1, answer
    outcome = check_rollout(stack, work, answer["final"], merges=merges)
    assert {c.wire_api for c in outcome.calls} == {wire_api}
    if not merges:
        assert outcome.follow_up.segment_reason == "history_rewritten"
        assert outcome.follow_up.segment_index == outcome.tool_call.segment_index + 1
        assert outcome.follow_up.prefix_token_count == 0
        assert outcome.stats["merge_rate"] == 0.0


# --- Gemini CLI ------------------------------------------------------------------------------

# Headless settings: API-key auth (with GOOGLE_GEMINI_BASE_URL set and no selected type it
# picks the "gateway" auth type, which headless mode refuses), no usage statistics (without
# this: CONNECT play.googleapis.com:443 at start and end), telemetry off, no update checks.
GEMINI_SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
}


class _Recorder(BaseHTTPRequestHandler):
    """A proxy that forwards nothing and remembers who tried to get out."""

    seen: list[str]

    def log_message(self, *args: Any) -> None:
        pass

    def _refuse(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        self.send_response(403)
        self.send_header("content-length", "0")
        self.end_headers()

    do_CONNECT = do_GET = do_POST = _refuse


@pytest.fixture
def outbound() -> Iterator[tuple[str, list[str]]]:
    """A proxy URL for HTTP(S)_PROXY and the list of requests it refused."""
    seen: list[str] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()


def test_gemini_cli(
    harness_bins: HarnessBins,
    capture_stack: Callable[[str], CaptureStack],
    tmp_path: Path,
    outbound: tuple[str, list[str]],
) -> None:
    gemini = require_binary(harness_bins.gemini, "Gemini CLI")
    stack = capture_stack("gemini-cli")
    home, work = tmp_path / "gemini-home", tmp_path / "work"
    (home / ".gemini").mkdir(parents=True)
    work.mkdir()
    (home / ".gemini" / "settings.json").write_text(json.dumps(GEMINI_SETTINGS))
    proxy, escaped = outbound
    env = {
        "PATH": base_path(),
        "HOME": str(home),
        "GEMINI_API_KEY": API_KEY,
        "GOOGLE_GEMINI_BASE_URL": stack.sidecar.url,
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
        # Anything that tries to leave 127.0.0.1 lands in `escaped`.
        "HTTPS_PROXY": proxy,
        "HTTP_PROXY": proxy,
        "NO_PROXY": "127.0.0.1,localhost",
    }
    # An explicit model: with the default ("auto") a classifier call picks one first.
    argv = [str(gemini), "-p", TASK, "--yolo", "--output-format", "json", "--model", "policy"]
    result = run_harness(argv, env=env, cwd=work, timeout=180, stack=stack)
    answer = json.loads(result.stdout)
    assert "error" not in answer, answer
    outcome = check_rollout(stack, work, answer["response"])
    assert escaped == []
    assert {c.wire_api for c in outcome.calls} == {"WIRE_API_GEMINI"}
    assert all(c.stream and c.model == "policy" for c in outcome.calls)
    assert outcome.stats["counters"].get("non_llm_passed", 0) == 0, outcome.stats
    [call] = json.loads(outcome.tool_call.response_json)["candidates"][0]["content"]["parts"]
    assert call["functionCall"]["name"] == "run_shell_command"
    contents = json.loads(outcome.follow_up.request_json)["contents"]
    assert "functionResponse" in contents[-1]["parts"][0]
