"""The same captured batches through veRL's Ray trainer and ``openforge train``, side by side.

One run builds a tiny Qwen2 policy and a real store holding ``--steps``
batches of ``--tasks`` tasks x ``--samples`` multi-turn rollouts (batch label
= iteration), then trains on them twice from the same weights:

* ``openforge``: ``openforge train`` (one process, one device), ``--steps``
  steps of ``--tasks`` groups;
* ``verl``: veRL's Ray trainer through ``verl_launch`` (local Ray, TaskRunner,
  TransferQueue, 2 FSDP2 workers over gloo on CPU, our agent loop and
  ``external`` rollout), the same steps and groups.

Both report their own per-step figures; the table puts them side by side:
wall time of the whole run, start-up (wall minus the steps), the steps, and
tokens/s (prompt + response tokens through the forward pass per second) over
the steps after the first (veRL's first step also starts its agent-loop and
reward workers). veRL's step is split into where its time goes: waiting for
the agent loop (``gen``), the update (``update_actor``), the weight sync and
publish (``update_weights``), the rest (TransferQueue, balancing, metrics).
The two runs are sequential, not interleaved (each owns both cores), so load
from elsewhere skews them: run it on an idle machine.

    python bench/verl_trainer.py           # 4 steps x 4 tasks x 4 samples, ~10 min on 2 cores
    python bench/verl_trainer.py --quick   # 2 steps x 2 tasks x 2 samples

Prints a table, then ``--- json ---`` and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from openforge_trainer.collection import store
from openforge_trainer.training import loop as trainer_loop
from openforge_trainer.training import metrics as train_metrics
from openforge_trainer.training import rollout_sampler, verl_launch

JOB = "bench"


def build(base: Path, *, tasks: int, samples: int, steps: int, turns: int) -> list[str]:
    """The tiny model and a store with ``steps`` batches; the task ids."""
    model_dir = rollout_sampler.build_tiny_model(base / "model")
    model = trainer_loop.load_model(model_dir, dtype="float32", device="cpu")
    names = [f"t{i}" for i in range(tasks)]
    with store.Store(base / "store.db") as db:
        for iteration in range(steps):
            rollout_sampler.write_rollouts(
                db,
                model,
                job=JOB,
                tasks=names,
                samples=samples,
                turns=turns,
                batch=str(iteration),
                seed=iteration,
                max_new_tokens=16,
            )
    return names


def _run(command: list[str], log: Path) -> float:
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{command[:4]} failed (exit {done.returncode}), see {log}")
    return time.monotonic() - started


def run_openforge(base: Path, *, tasks: int, samples: int, steps: int) -> dict[str, Any]:
    run_dir = base / "openforge"
    wall = _run(
        [
            *(sys.executable, "-m", "openforge.cli", "train"),
            *("--store", str(base / "store.db"), "--job", JOB, "--model", str(base / "model")),
            *("--run-dir", str(run_dir), "--steps", str(steps)),
            *("--groups-per-step", str(tasks), "--group-size", str(samples)),
            *("--wait-for-groups", "0", "--poll-interval", "0.2"),
        ],
        base / "openforge.log",
    )
    per_step = train_metrics.read(run_dir / train_metrics.JSONL)
    return {
        "wall_s": wall,
        "steps": [
            {
                "tokens": m["tokens"],
                "step_s": m["step_seconds"],
                "update_s": m["update_seconds"],
            }
            for m in per_step
        ],
    }


def run_verl(base: Path, *, task_ids: list[str], samples: int, steps: int) -> dict[str, Any]:
    run_dir = base / "verl"
    command = [
        *(sys.executable, "-m", "openforge_trainer.training.verl_launch"),
        *("--store", str(base / "store.db"), "--job", JOB, "--model", str(base / "model")),
        *("--run-dir", str(run_dir), "--steps", str(steps), "--group-size", str(samples)),
        *(arg for task in task_ids for arg in ("--task", task)),
    ]
    wall = _run(command, base / "verl.log")
    per_step = [entry["data"] for entry in verl_launch.metrics(run_dir)]
    return {
        "wall_s": wall,
        "steps": [
            {
                "tokens": m["perf/total_num_tokens"],
                "step_s": m["timing_s/step"],
                "update_s": m["timing_s/update_actor"] + m.get("timing_s/old_log_prob", 0.0),
                "gen_s": m.get("timing_s/gen", 0.0),
                "update_weights_s": m.get("timing_s/update_weights", 0.0),
            }
            for m in per_step
        ],
    }


def summarize(result: dict[str, Any]) -> dict[str, float]:
    steps = result["steps"]
    later = steps[1:] or steps
    stepped = sum(s["step_s"] for s in steps)
    return {
        "wall_s": result["wall_s"],
        "startup_s": result["wall_s"] - stepped,
        "first_step_s": steps[0]["step_s"],
        "later_step_s": sum(s["step_s"] for s in later) / len(later),
        "tokens_per_step": sum(s["tokens"] for s in later) / len(later),
        "tokens_per_s": sum(s["tokens"] for s in later) / sum(s["step_s"] for s in later),
        "update_tokens_per_s": sum(s["tokens"] for s in later) / sum(s["update_s"] for s in later),
    }


def main(argv: list[str]) -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    cli.add_argument("--quick", action="store_true")
    cli.add_argument("--steps", type=int)
    cli.add_argument("--tasks", type=int)
    cli.add_argument("--samples", type=int)
    cli.add_argument("--turns", type=int, default=3)
    cli.add_argument("--keep", type=Path, help="keep the runs' files in this directory")
    args = cli.parse_args(argv)
    steps = args.steps or (2 if args.quick else 4)
    tasks = args.tasks or (2 if args.quick else 4)
    samples = args.samples or (2 if args.quick else 4)
    base = args.keep or Path(tempfile.mkdtemp(prefix="verl-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    task_ids = build(base, tasks=tasks, samples=samples, steps=steps, turns=args.turns)
    openforge = run_openforge(base, tasks=tasks, samples=samples, steps=steps)
    verl = run_verl(base, task_ids=task_ids, samples=samples, steps=steps)
    rows = {"openforge train": summarize(openforge), "veRL (Ray, 2x FSDP2)": summarize(verl)}
    header = f"{'engine':22} {'wall s':>8} {'start-up s':>10} {'1st step s':>10} "
    header += f"{'later step s':>12} {'tokens/step':>11} {'tokens/s':>9} {'update tok/s':>12}"
    print(
        f"{steps} steps x {tasks} tasks x {samples} samples, {args.turns} turns, on "
        f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()})"
    )
    print(header)
    for name, r in rows.items():
        print(
            f"{name:22} {r['wall_s']:8.1f} {r['startup_s']:10.1f} {r['first_step_s']:10.1f} "
            f"{r['later_step_s']:12.2f} {r['tokens_per_step']:11.0f} {r['tokens_per_s']:9.1f} "
            f"{r['update_tokens_per_s']:12.1f}"
        )
    ours, theirs = rows["openforge train"], rows["veRL (Ray, 2x FSDP2)"]
    later = verl["steps"][1:] or verl["steps"]
    split = {
        key: sum(s[key] for s in later) / sum(s["step_s"] for s in later)
        for key in ("gen_s", "update_s", "update_weights_s")
    }
    print(
        f"veRL / openforge: wall {theirs['wall_s'] / ours['wall_s']:.2f}x, "
        f"later-step tokens/s {theirs['tokens_per_s'] / ours['tokens_per_s']:.2f}x, "
        f"update tokens/s {theirs['update_tokens_per_s'] / ours['update_tokens_per_s']:.2f}x"
    )
    print(
        "veRL's later steps: "
        + ", ".join(f"{key.removesuffix('_s')} {share:.0%}" for key, share in split.items())
        + f", other {1 - sum(split.values()):.0%}"
    )
    print("--- json ---")
    print(
        json.dumps(
            {"rows": rows, "verl_step_split": split, "runs": {"openforge": openforge, "verl": verl}}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
