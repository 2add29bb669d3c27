"""The demo with the real Codex CLI as the harness: examples/codex-toy.yaml.

It is examples/react-toy.yaml with one line changed, and ``openforge run``
runs it as it is: Codex CLI from npm (``scripts/install_harnesses.sh``),
configured by examples/harnesses/codex/run.py, answered by ``openforge
serve`` with the tiny policy through each rollout's own sidecar, graded by
the toy task's grader, every call in the store.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
from openforge_trainer.collection import store

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
RUN_PY = EXAMPLES / "harnesses" / "codex" / "run.py"


def load_run_py() -> ModuleType:
    spec = importlib.util.spec_from_file_location("codex_run", RUN_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_codex_example_is_the_react_example_with_one_line_changed() -> None:
    react = (EXAMPLES / "react-toy.yaml").read_text().splitlines()
    codex = (EXAMPLES / "codex-toy.yaml").read_text().splitlines()
    changed = [
        line
        for line in difflib.unified_diff(react, codex, lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert changed == ["-  name: &harness react-toy", "+  name: &harness codex-toy"]


def test_the_one_line_picks_the_harness_and_names_the_job() -> None:
    from openforge_runner import plan

    for name, api in [("react-toy", "openai-chat"), ("codex-toy", "openai-responses")]:
        bundle = plan.load([EXAMPLES / f"{name}.yaml"])
        assert (bundle.name, bundle.env.metadata.name, bundle.env.spec.api) == (name, name, api)


def test_codex_config_points_only_at_the_base_url(tmp_path: Path) -> None:
    run = load_run_py()
    instructions = tmp_path / "instructions.md"
    text = run.config_toml(
        base_url='http://127.0.0.1:1/v1"x', model="policy", instructions=instructions
    )
    config = tomllib.loads(text)
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == 'http://127.0.0.1:1/v1"x'  # quoted, not injected
    assert provider["wire_api"] == "responses" and provider["request_max_retries"] == 0
    assert config["model_instructions_file"] == str(instructions.resolve())
    assert config["features"]["plugins"] is False and config["analytics"]["enabled"] is False
    assert "model_instructions_file" not in tomllib.loads(
        run.config_toml(base_url="http://x/v1", model="m", instructions=None)
    )


def test_codex_launcher_needs_a_base_url(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(RUN_PY), "--prompt", "hi", "--workdir", str(tmp_path)],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2 and "OPENAI_BASE_URL is not set" in done.stderr


def slice_of(example: str, tmp_path: Path, *, tasks: int, samples: int) -> Path:
    """The example as it is, on its first ``tasks`` tasks with ``samples`` samples each."""
    lines = (EXAMPLES / "tasks" / "toy-tools" / "demo.jsonl").read_text().splitlines()[:tasks]
    (tmp_path / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    text = (EXAMPLES / example).read_text()
    for old, new in [
        ("$OPENFORGE_MANIFEST_DIR", str(EXAMPLES)),
        ("${OPENFORGE_MANIFEST_DIR}", str(EXAMPLES)),
        ("file: tasks/toy-tools/demo.jsonl", f"file: {tmp_path / 'tasks.jsonl'}"),
        ("model: models/tiny-react", f"model: {EXAMPLES / 'models' / 'tiny-react'}"),
        ("samplesPerTask: 4", f"samplesPerTask: {samples}"),
        ("parallelism: 4", "parallelism: 2"),
    ]:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / example
    path.write_text(text)
    return path


@pytest.mark.harness
@pytest.mark.slow
def test_openforge_run_captures_graded_codex_rollouts(tmp_path: Path) -> None:
    codex = load_run_py().codex_binary()
    if codex is None or not Path(codex).is_file():
        pytest.skip("Codex CLI is not installed; run scripts/install_harnesses.sh")
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "openforge.cli", "run",
         str(slice_of("codex-toy.yaml", tmp_path, tasks=2, samples=2)),
         "--iterations", "1", "--no-train", "--quiet", "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "iteration 1/1: 4/4 done, 0 failed" in done.stdout
    journal = [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]
    finished = [e for e in journal if e["event"] == "finish"]
    assert len(finished) == 4
    for entry in finished:
        assert entry["status"] == "succeeded" and entry["exit_code"] == 0, entry
        assert isinstance(entry["reward"], float) and entry["calls"] >= 1, entry
        work = run_dir / "rollouts" / entry["rollout_id"] / "work"
        assert sorted(p.name for p in work.iterdir()) == ["answer.txt", "colors.json"]
        grade = json.loads((run_dir / "rollouts" / entry["rollout_id"] / "grader.log").read_text())
        assert grade["reward"] == entry["reward"] and grade["answer"] is not None
    with store.Store(run_dir / "store.db") as db:
        rollouts = db.rollouts("codex-toy")
        assert len(rollouts) == 4 and all(r.complete and r.has_reward for r in rollouts)
        assert {r.harness for r in rollouts} == {"codex-toy"}
        for rollout in rollouts:
            calls = db.calls(rollout.rollout_id)
            assert calls and all(c.http_status == 200 and not c.error for c in calls)
            assert {c.wire_api for c in calls} == {"WIRE_API_OPENAI_RESPONSES"}
            assert all(c.token_exact and c.completion_token_ids for c in calls)
            tools = [t.get("name") for t in json.loads(calls[0].request_json)["tools"]]
            assert "exec_command" in tools  # Codex's own tools, not the ReAct agent's
