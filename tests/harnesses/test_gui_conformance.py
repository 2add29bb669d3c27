"""The GUI browser agent through the capture sidecar, on real Chromium and a real Xvfb.

The agent (``examples/harnesses/gui-browser``) works on a web-forms task
(``examples/tasks/web-forms``): ``serve.py`` serves the task's site on
127.0.0.1 around it, and the site's own log grades it. Its base URL points at
a real sidecar (reverse mode, tokens capture) in front of the deterministic
test engine, whose GUI script (``openforge_trainer.testengine.gui``) reads the
task's steps and each observation's element list and answers with
``click``/``type_text``/``press_key`` tool calls; a real collector stores the
calls.

Checked: the task is done (graded 1.0 from the site's log); every call is
captured, stored and token-exact against the engine asked directly, and each
extends the previous one (one segment); each screenshot the agent sent is in
the recorded request byte for byte (the PNG inside the data URL equals the
file the agent wrote); the exported training row carries every image once, in
the order of the ``<image>`` placeholders in its tokens (veRL's agent-loop
output of such a row is tested in tests/trainer/training/test_verl_agent_loop.py). Also:
``openforge run`` runs the manifest's local recipe against the test engine.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness_stack import CaptureStack
from openforge_trainer.collection import store
from openforge_trainer.tiny import tokenizer_build
from openforge_trainer.trajectories import export, request_images
from PIL import Image
from tokenizers import Tokenizer

pytestmark = pytest.mark.harness

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "examples" / "harnesses" / "gui-browser"
TASKS = ROOT / "examples" / "tasks" / "web-forms"
MANIFEST = HARNESS / "harnessenv.yaml"
JOB = HARNESS / "web-forms-job.yaml"


def require_gui() -> None:
    if shutil.which("Xvfb") is None or not (
        os.access("/usr/lib/chromium/chromium", os.X_OK) or shutil.which("chromium")
    ):
        pytest.skip("Chromium or Xvfb is not installed; run scripts/install_gui_deps.sh")


def run_task(
    stack: CaptureStack, work: Path, task_id: str, *flags: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_BASE_URL": f"{stack.sidecar.url}/v1", "OPENAI_API_KEY": "sk-dummy"}
    argv = [sys.executable, str(TASKS / "serve.py"), "--task-id", task_id, "--workdir", str(work),
            "--", sys.executable, str(HARNESS / "agent.py"),
            "--task-file", str(TASKS / "tasks.jsonl"), "--task-id", task_id, "--workdir", str(work),
            "--transcript", str(work / "transcript.json"), *flags]  # fmt: skip
    done = subprocess.run(
        argv,
        env=env,
        cwd=work,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, (
        f"{done.stdout}\n{done.stderr[-4000:]}\n--- sidecar\n{stack.log_tail()}"
    )
    return done


def grade(work: Path, task_id: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(TASKS / "grade.py"),
                           "--task-id", task_id, "--workdir", str(work)],
                          capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def data_urls(call: store.ModelCall) -> list[str]:
    """The image URLs in a recorded Chat Completions request, read straight from its JSON."""
    body = json.loads(call.request_json)
    return [p["image_url"]["url"] for m in body["messages"] if isinstance(m["content"], list)
            for p in m["content"] if p["type"] == "image_url"]  # fmt: skip


@pytest.mark.parametrize(
    ("task_id", "flags", "actions"),
    [
        ("contact-ada", (), ["click", "type_text", "click", "type_text", "click"]),
        ("search-kettle", ("--stream", "--headless"), ["click", "type_text", "press_key"]),
    ],
)
def test_gui_agent_completes_a_task_token_exact_with_lossless_screenshots(
    capture_stack: Callable[[str], CaptureStack],
    tmp_path: Path,
    task_id: str,
    flags: tuple[str, ...],
    actions: list[str],
) -> None:
    require_gui()
    stack = capture_stack("gui-browser")
    work = tmp_path / "work"
    work.mkdir()
    done = run_task(stack, work, task_id, *flags)
    assert done.stdout.strip() == "Done."
    assert grade(work, task_id)["reward"] == 1.0, (work / "web-forms-log.jsonl").read_text()

    transcript = json.loads((work / "transcript.json").read_text())
    calls_made = [
        c["function"]["name"]
        for m in transcript
        if m["role"] == "assistant"
        for c in m.get("tool_calls", [])
    ]
    assert calls_made == actions

    stats = stack.finish()
    calls = stack.calls()
    assert len(calls) == stats["calls"] == len(actions) + 1
    assert stats["merge_rate"] == 1.0, stats
    for previous, call in zip([None, *calls], calls, strict=False):
        assert call.http_status == 200 and call.error == "", (call.call_index, call.error)
        assert call.stream == ("--stream" in flags)
        stack.check_token_exact(call)
        if previous is not None:
            assert call.segment_index == previous.segment_index
            prefix = list(previous.prompt_token_ids) + list(previous.completion_token_ids)
            assert list(call.prompt_token_ids[: len(prefix)]) == prefix

    # Lossless: the n-th screenshot in every request is the n-th PNG the agent wrote.
    shots = [p.read_bytes() for p in sorted((work / "screenshots").glob("step-*.png"))]
    assert len(shots) == len(actions) + 1
    assert all(s.startswith(b"\x89PNG\r\n\x1a\n") for s in shots)
    for index, call in enumerate(calls):
        sent = [request_images.image_bytes(url) for url in data_urls(call)]
        assert sent == shots[: index + 1]

    # The training row: one segment, every image once, in placeholder order.
    with store.Store(stack.store_path) as db:
        rows, export_stats = export.rollout_rows(db.rollout(stack.rollout_id), calls)  # type: ignore[arg-type]
    assert len(rows) == 1 and export_stats.merge_rate == 1.0
    row = rows[0]
    assert [request_images.image_bytes(url) for url in row.images] == shots
    tokenizer = Tokenizer.from_file(str(tokenizer_build.committed_assets() / "tokenizer.json"))
    image_token = tokenizer.token_to_id("<image>")
    assert (row.prompt_ids + row.response_ids).count(image_token) == len(shots)
    assert row.prompt_ids.count(image_token) == 1  # the first observation; the rest are tool-side
    image_positions = [i for i, t in enumerate(row.response_ids) if t == image_token]
    assert all(row.response_mask[i] == 0 for i in image_positions)

    # Decodable, and veRL's agent loop gets the same pixels
    # (tests/trainer/training/test_verl_agent_loop.py).
    with Image.open(io.BytesIO(request_images.image_bytes(row.images[-1]))) as last:
        assert last.size == (800, 600)


def test_local_recipe_runs_under_openforge_run(procs: Any, tmp_path: Path) -> None:
    """The committed HarnessEnv's local recipe, capture-only against the test engine: graded 1.0."""
    require_gui()
    engine = procs.engine()
    job = yaml.safe_load(JOB.read_text())
    job["spec"].update(tasks={"inline": [{"id": "order-1043"}]}, samplesPerTask=1, parallelism=1,
                       policy={"model": "openforge-tiny", "endpoint": engine.url})  # fmt: skip
    job_path = tmp_path / "job.yaml"
    job_path.write_text(yaml.safe_dump(job, sort_keys=False))
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "openforge.cli", "run", str(MANIFEST), str(job_path),
         "--no-train", "--quiet", "--run-dir", str(run_dir), "--iterations", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1/1 done, 0 failed, mean reward 1.0" in done.stdout, done.stdout
    with store.Store(run_dir / "store.db") as db:
        (rollout,) = db.rollouts(job["metadata"]["name"])
        calls = db.calls(rollout.rollout_id)
    assert rollout.reward == 1.0 and len(calls) == 2
    assert all(c.token_exact for c in calls)
    work = run_dir / "rollouts" / rollout.rollout_id / "work"
    assert sorted(p.name for p in (work / "screenshots").iterdir()) == [
        "step-000.png",
        "step-001.png",
    ]
