"""The policy learns inside the real Codex CLI, on CPU, through the real path.

`openforge run examples/harnesses/codex/learn.yaml`: Codex CLI (unmodified,
from npm) runs each toy task against its own capture sidecar, which
generates from `openforge serve` with examples/models/tiny-codex (warm-started
on Codex's own requests); the collector stores every Responses call token for
token; `openforge train` takes a GRPO step per iteration and pushes the new
weights. The pass rate must rise, and the logprobs the trainer recomputes
must match the captured ones.

The first request Codex makes must be, token for token, what tiny-codex was
warm-started on (examples/harnesses/codex/harness.json): if a Codex upgrade
changes its request, this test says so before the curve does.

The statistic is tests/runner/test_learning.py's: the fitted trend over all
iterations, or the later half against the first two, must rise by at least
0.2, and the last two iterations must end above the first. It runs
learn.yaml's 10 iterations: over 10 a policy that does not learn clears 0.2
on either statistic in under 1% of simulated runs. A clean-clone CI run of 8
iterations began with a lucky batch (0.47, 0.44, 0.38, 0.41, 0.56, 0.69,
0.50, 0.56): +0.06 first against last, +0.17 fitted; the warm start's first
iteration has ranged 0.09-0.47 over eight runs (0.27 on average). Another
learned by its fourth iteration and dipped at its seventh (0.22, 0.22, 0.44,
0.53, 0.53, 0.47, 0.25, 0.44, 0.47, 0.53): +0.197 fitted, which failed when
the fitted trend was the only statistic, +0.21 by halves.

learn.yaml's Adam epsilon (1e-5), KL to the initial policy (0.05) and step
guard (updateBacktracks: 4) are what make this reliable enough for CI: at
the defaults the tiny policy's tool-call format sometimes broke in one step
(a clean-clone CI run went 0.31, 0.31, 0.38, 0.31, 0.59, 0.09, 0.59), as 3 of
8 seeds of scripts/toy_rl_probe.py did; with the epsilon and the KL no probe
seed collapsed over 7 steps, but a clean-clone CI run still did after its
fifth (0.28, 0.34, 0.41, 0.47, 0.62, 0.00, 0.03, 0.00). Each collapse began
with a step that lowered the log-probabilities of its own successes, which
the guard halves; it rescued all three probe seeds that collapsed at the
defaults. The measured runs are in docs/harnesses.md, "Learning inside Codex
CLI".
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import learning_runs
import pytest
from openforge_trainer.collection import store
from openforge_trainer.tiny import tokenizer_build, warmstart

ROOT = Path(__file__).resolve().parents[2]
CODEX_DIR = ROOT / "examples" / "harnesses" / "codex"
ITERATIONS = 10
THRESHOLD = 0.2

pytestmark = [pytest.mark.slow, pytest.mark.harness]


def codex_installed() -> bool:
    spec = importlib.util.spec_from_file_location("codex_run", CODEX_DIR / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    binary = module.codex_binary()
    return binary is not None and Path(binary).is_file()


# measured: 6-13 min wall for 8 iterations on 2 idle cores, ~175 CPU-seconds an iteration;
# beside the rest of the suite in CI, up to 440 s an iteration
@pytest.mark.timeout(3200)
def test_reward_rises_inside_codex_cli(tmp_path: Path) -> None:
    if not codex_installed():
        pytest.skip("Codex CLI is not installed; run scripts/install_harnesses.sh")
    run_dir = tmp_path / "run"
    learning_runs.train(
        [sys.executable, "-m", "openforge.cli", "run", str(CODEX_DIR / "learn.yaml"),
         "--run-dir", str(run_dir), "--iterations", str(ITERATIONS), "--quiet"],
        timeout=3000,
    )  # fmt: skip
    by_iteration = learning_runs.rewards_by_iteration(run_dir)
    learning_runs.assert_rise(by_iteration, iterations=ITERATIONS, at_least=THRESHOLD)
    steps = learning_runs.training_steps(run_dir)
    assert [s["policy_version"] for s in steps] == [float(v) for v in range(1, ITERATIONS + 1)]
    # token exactness across the loop: what was sampled is what is trained
    assert max(s["logprob_diff_max"] for s in steps) < 1e-4
    # learn.yaml's training options reached the trainer: every step was guarded
    assert all(0.0 <= s["update_scale"] <= 1.0 for s in steps)
    check_codex_asked_what_tiny_codex_learned(run_dir / "store.db")


def check_codex_asked_what_tiny_codex_learned(store_path: Path) -> None:
    harness = warmstart.HarnessSpec.load(CODEX_DIR / "harness.json")
    tokenizer = warmstart.load_tokenizer()
    tasks = {
        t["id"]: t
        for t in (
            json.loads(line)
            for line in (ROOT / "examples" / "tasks" / "toy-tools" / "demo.jsonl")
            .read_text()
            .splitlines()
        )
    }
    looked_up = 0
    with store.Store(store_path) as db:
        rollouts = db.rollouts("codex-learn")
        assert len(rollouts) == 32 * ITERATIONS
        for rollout in rollouts:
            calls = db.calls(rollout.rollout_id)
            assert calls and all(
                c.token_exact and c.wire_api == "WIRE_API_OPENAI_RESPONSES" for c in calls
            )
            text = tokenizer_build.render_chat(
                harness.messages(tasks[rollout.task_id]["prompt"]),
                list(harness.tools),
                add_generation_prompt=True,
            )
            assert (
                list(calls[0].prompt_token_ids)
                == tokenizer.encode(text, add_special_tokens=False).ids
            ), rollout.rollout_id
            looked_up += any(
                item.get("type") == "function_call_output"
                for c in calls
                for item in json.loads(c.request_json)["input"]
            )
    assert looked_up > 0  # Codex ran the policy's shell command and sent its output back
