"""What the OpenForge training pipeline costs over a bare torch update of the same tensors.

One run, two policies from the same weights, stepped alternately on the same data:

* ``pipeline``: everything ``openforge train`` does for a step except the
  checkpoint and the publish (timed separately): read the ready groups from
  the SQLite store, export their rows, build the veRL ``DataProto``, GRPO
  advantages (veRL's estimator), then the update (micro-batches within the
  token budget, full-sequence forward, veRL's clipped PPO loss and agg_loss,
  backward, global-norm clipping, AdamW);
* ``bare``: a plain torch loop given the finished tensors of the same batch
  (ids, masks, positions, captured log-probs, advantages) and the same
  micro-batches, doing the same maths by hand (forward, log-softmax gather,
  clipped PPO token-mean loss, backward, clipping, AdamW).

Both see identical data and weights, so their losses must agree step by step
(``loss_max_abs_diff``; a check that the comparison is like for like). Tokens
are real (non-padding) tokens through the forward pass. Overhead is the
median over the measured steps (after one warm-up step each) of pipeline
step time / bare step time - 1: each step's two runs are back to back on
the same batch, so the ratio of a pair is robust to load from elsewhere on
a shared machine; the ratio of the totals is reported too. Rollouts are synthetic (random tokens,
log-probs from the policy's own forward pass), written to a real store as the collector would.

    python bench/trainer_throughput.py           # full run, a few minutes
    python bench/trainer_throughput.py --quick   # smoke run, seconds

Prints a table, then ``--- json ---`` and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from openforge_trainer.collection import store
from openforge_trainer.training import checkpoint, rollout_sampler
from openforge_trainer.training import config as train_config
from openforge_trainer.training import loop as trainer_loop

TARGET_OVERHEAD = 0.10
JOB = "bench"


@dataclass(frozen=True)
class Workload:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    groups: int  # task groups per step
    samples: int  # rollouts per group
    prompt_tokens: int
    turns: int
    new_tokens: int  # model tokens per turn
    tool_tokens: int
    steps: int  # measured steps (plus one warm-up)
    micro_batch_tokens: int


FULL = Workload(128, 3, 4, 2, 384, 4, 4, 192, 3, 48, 16, 10, 4096)
QUICK = Workload(64, 2, 4, 2, 128, 2, 2, 24, 2, 8, 4, 2, 512)


def synthesize(db_path: Path, model: Any, work: Workload, seed: int) -> int:
    """Write (steps + 1) x groups task groups of rollouts; the number of rollouts."""
    rng = random.Random(seed)
    count = 0
    with store.Store(db_path) as db, torch.no_grad():
        for task_number in range((work.steps + 1) * work.groups):
            task = f"task-{task_number:04d}"
            prompt = [1] + [rng.randrange(10, 4096) for _ in range(work.prompt_tokens)] + [2, 1]
            for sample in range(work.samples):
                calls, context = [], list(prompt)
                pieces: list[tuple[int, int]] = []  # (start, length) of each completion
                for turn in range(work.turns):
                    if turn:
                        context += [
                            5,
                            *(rng.randrange(10, 4096) for _ in range(work.tool_tokens)),
                            6,
                            1,
                        ]
                    pieces.append((len(context), work.new_tokens))
                    context += [rng.randrange(10, 4096) for _ in range(work.new_tokens)]
                logits = model(input_ids=torch.tensor([context])).logits[0].float()
                log_probs = torch.log_softmax(logits, dim=-1)
                for start, length in pieces:
                    tokens = context[start : start + length]
                    scores = [float(log_probs[start - 1 + i, t]) for i, t in enumerate(tokens)]
                    calls.append((context[:start], tokens, scores))
                rollout_id = f"{task}-{sample}"
                db.put(
                    rollout_sampler.rollout_records(
                        rollout_id,
                        job=JOB,
                        task=task,
                        sample_index=sample,
                        calls=calls,
                        policy_version=0,
                        reward=float(rng.random() < 0.5),
                    )
                )
                count += 1
    return count


class Bare:
    """The same update by hand: no store, no veRL, no bookkeeping."""

    def __init__(self, model_dir: Path, config: train_config.TrainConfig) -> None:
        self.model = trainer_loop.load_model(model_dir, dtype="float32", device="cpu").train()
        self.config = config
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=config.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0
        )

    def step(self, parts: list[dict[str, Any]], total_tokens: int) -> float:
        low, high, dual = (
            self.config.clip_ratio_low,
            self.config.clip_ratio_high,
            self.config.clip_ratio_c,
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for part in parts:
            logits = self.model(
                input_ids=part["input_ids"],
                attention_mask=part["attention_mask"],
                position_ids=part["position_ids"],
            ).logits
            start = part["response_start"]
            response = logits[:, start : start + part["responses"].shape[1]].float()
            log_prob = (
                torch.log_softmax(response, dim=-1)
                .gather(-1, part["responses"].unsqueeze(-1))
                .squeeze(-1)
            )
            ratio = torch.exp(torch.clamp(log_prob - part["old_log_probs"], -20, 20))
            advantages = part["advantages"]
            clipped = torch.maximum(
                -advantages * ratio, -advantages * torch.clamp(ratio, 1 - low, 1 + high)
            )
            losses = torch.where(
                advantages < 0, torch.minimum(-advantages * dual, clipped), clipped
            )
            mask = part["response_mask"].float()
            loss = (losses * mask).sum() / total_tokens
            loss.backward()
            loss_sum += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_sum


def pipeline_step(run: trainer_loop.Trainer) -> tuple[dict[str, float], Any]:
    """One step of openforge train minus checkpoint/publish; timings and the batch."""
    timings: dict[str, float] = {}
    started = time.perf_counter()
    selection = trainer_loop.select_groups(
        run.store, run.config, state=run.state, limit=run.config.groups_per_step
    )
    timings["select_export_s"] = time.perf_counter() - started
    mark = time.perf_counter()
    batch = run.make_batch(selection.groups)
    timings["batch_s"] = time.perf_counter() - mark
    mark = time.perf_counter()
    update = run.update(batch)
    timings["update_s"] = time.perf_counter() - mark
    timings["total_s"] = time.perf_counter() - started
    timings["loss"] = update["loss"]
    timings["tokens"] = update["tokens"]
    timings["logprob_diff_max"] = update["logprob_diff_max"]
    for group in selection.groups:  # what the checkpoint would record: never picked again
        run.state.trained.update(
            dict.fromkeys((r.rollout_id for r in group.rollouts), run.state.step)
        )
    return timings, batch


def bare_parts(run: trainer_loop.Trainer, batch: Any) -> tuple[list[dict[str, Any]], int]:
    """The finished tensors of the batch, in the pipeline's micro-batches (not timed)."""
    tensors = batch.batch
    width = int(batch.meta_info["prompt_width"])
    attention = tensors["attention_mask"]
    prompts, responses = (
        attention[:, :width].sum(-1).tolist(),
        attention[:, width:].sum(-1).tolist(),
    )
    parts = [
        trainer_loop._slice(
            tensors,
            rows,
            width=width,
            prompt_lengths=prompts,
            response_lengths=responses,
            device="cpu",
        )
        for rows in trainer_loop.micro_batches(
            prompts, responses, budget=run.config.micro_batch_tokens
        )
    ]
    return parts, int(tensors["response_mask"].sum())


def measure(work: Workload, seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="openforge-bench-") as scratch:
        base = Path(scratch)
        model_dir = rollout_sampler.build_tiny_model(
            base / "model",
            seed=seed,
            hidden_size=work.hidden,
            intermediate_size=work.intermediate,
            layers=work.layers,
            heads=work.heads,
            kv_heads=work.kv_heads,
        )
        model = trainer_loop.load_model(model_dir, dtype="float32", device="cpu").eval()
        rollouts = synthesize(base / "store.db", model, work, seed)
        config = train_config.load(
            store=base / "store.db",
            job=JOB,
            model=model_dir,
            run_dir=base / "run",
            groups_per_step=work.groups,
            group_size=work.samples,
            lr=1e-4,
            micro_batch_tokens=work.micro_batch_tokens,
            seed=seed,
            max_staleness=10_000,
        )
        run = trainer_loop.Trainer.open(config, publishers=[], log=lambda line: None)
        bare = Bare(model_dir, config)
        pipe_times: list[dict[str, float]] = []
        bare_times: list[float] = []
        loss_diffs: list[float] = []
        for step in range(work.steps + 1):
            # alternate which goes first, so load from elsewhere hits both alike
            order = ("pipeline", "bare") if step % 2 == 0 else ("bare", "pipeline")
            batch = None
            pending_bare = None
            for which in order:
                if which == "pipeline":
                    timings, batch = pipeline_step(run)
                    if pending_bare is not None:
                        loss_diffs.append(abs(timings["loss"] - pending_bare))
                else:
                    if batch is None:  # bare goes first: build this step's tensors untimed
                        probe = trainer_loop.select_groups(
                            run.store, config, state=run.state, limit=work.groups
                        )
                        batch = run.make_batch(probe.groups)
                    parts, tokens = bare_parts(run, batch)
                    started = time.perf_counter()
                    bare_loss = bare.step(parts, tokens)
                    seconds = time.perf_counter() - started
                    if order[0] == "pipeline":
                        loss_diffs.append(abs(timings["loss"] - bare_loss))
                    else:
                        pending_bare = bare_loss
            if step == 0:  # step 0 warms both up; the weights are still those that sampled
                first_diff = timings["logprob_diff_max"]
            else:
                pipe_times.append(timings)
                bare_times.append(seconds)
        started = time.perf_counter()
        checkpoint.save(
            config.run_dir,
            state=run.state,
            model=run.model,
            optimizer=run.optimizer,
            assets_from=model_dir,
            keep=1,
        )
        checkpoint_s = time.perf_counter() - started
        run.close()
    tokens = sum(t["tokens"] for t in pipe_times)
    pipe_s = sum(t["total_s"] for t in pipe_times)
    bare_s = sum(bare_times)
    paired = [t["total_s"] / b - 1 for t, b in zip(pipe_times, bare_times, strict=True)]
    overhead = statistics.median(paired)
    return {
        "workload": work.__dict__,
        "rollouts_in_store": rollouts,
        "tokens_per_step": tokens / len(pipe_times),
        "pipeline_tokens_per_s": tokens / pipe_s,
        "bare_tokens_per_s": tokens / bare_s,
        "overhead": overhead,
        "overhead_total": pipe_s / bare_s - 1,
        "overhead_per_step": paired,
        "target_overhead": TARGET_OVERHEAD,
        "meets_target": overhead <= TARGET_OVERHEAD,
        "pipeline_breakdown_s": {
            key: statistics.mean(t[key] for t in pipe_times)
            for key in ("select_export_s", "batch_s", "update_s", "total_s")
        },
        "bare_step_s": statistics.mean(bare_times),
        "checkpoint_s": checkpoint_s,
        "loss_max_abs_diff": max(loss_diffs),
        "first_step_logprob_diff_max": first_diff,
        "steps": len(pipe_times),
    }


def table(result: dict[str, Any]) -> str:
    b = result["pipeline_breakdown_s"]
    rows = [
        ("path", "tokens/s", "step s", "of which"),
        (
            "pipeline",
            f"{result['pipeline_tokens_per_s']:.0f}",
            f"{b['total_s']:.3f}",
            f"select+export {b['select_export_s'] * 1e3:.1f} ms, batch {b['batch_s'] * 1e3:.1f} "
            f"ms, update {b['update_s']:.3f} s",
        ),
        (
            "bare",
            f"{result['bare_tokens_per_s']:.0f}",
            f"{result['bare_step_s']:.3f}",
            "update only",
        ),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    verdict = "meets" if result["meets_target"] else "MISSES"
    lines.append(
        f"overhead {result['overhead']:+.1%} (median of per-step pairs; {verdict} the "
        f"<= {TARGET_OVERHEAD:.0%} target; over all steps {result['overhead_total']:+.1%}); "
        f"{result['tokens_per_step']:.0f} tokens/step over {result['steps']} steps; "
        f"checkpoint {result['checkpoint_s']:.2f} s (not in either figure); "
        f"max |loss pipeline - bare| {result['loss_max_abs_diff']:.2e}"
    )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny model, two steps")
    parser.add_argument("--steps", type=int, help="measured steps (default: workload's)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    work = QUICK if args.quick else FULL
    if args.steps:
        work = Workload(**{**work.__dict__, "steps": args.steps})
    result = measure(work, args.seed)
    result["machine"] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": args.threads,
        "cpu": platform.processor() or platform.machine(),
    }
    print(table(result))
    print("--- json ---")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
