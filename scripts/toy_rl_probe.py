"""Does policy-gradient RL raise the warm-started tiny policy's pass rate? A probe.

Not the production trainer: a plain on-policy GRPO-style loop (group-relative
advantages, one update per batch, so no ratio or clipping) over episodes
played in-process by :mod:`openforge_trainer.policy_eval`, token for token as
the ReAct harness and the sidecar would. It exists to find hyperparameters
for the real trainer and to show the curve:

    python scripts/toy_rl_probe.py --model ~/.cache/openforge/models/tiny-react \\
        --steps 30 --lr 5e-4 --group 8 --tasks-per-step 8 --out /tmp/probe.json

It prints one line per step (mean reward of the batch, lookup rate) and, every
``--eval-every`` steps, the held-out pass rate at temperature 1.0.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
from openforge_trainer import policy_eval, warmstart
from transformers import AutoModelForCausalLM


def advantages(rewards: list[float], group: int) -> list[float]:
    """GRPO: reward minus its group's mean, over the group's std (0 where all agree)."""
    out = []
    for start in range(0, len(rewards), group):
        chunk = torch.tensor(rewards[start : start + group])
        std = float(chunk.std())
        out += [0.0] * len(chunk) if std == 0 else ((chunk - chunk.mean()) / (std + 1e-6)).tolist()
    return out


def policy_loss(model: Any, episodes: list[policy_eval.Episode], advs: list[float], pad_id: int) -> torch.Tensor | None:
    """-sum(A * log p(response tokens)) / number of response tokens (token-level mean)."""
    kept = [(e, a) for e, a in zip(episodes, advs, strict=True) if a != 0.0]
    if not kept:
        return None
    encoded = []
    for episode, _ in kept:
        ids, mask, _ = episode.sequence()
        encoded.append(warmstart.Encoded(ids, mask))
    batch = warmstart.collate(encoded, pad_id)
    nll = warmstart.token_nll(model, batch)
    mask = batch["loss_mask"][:, 1:]
    weights = torch.tensor([a for _, a in kept])[:, None]
    return (nll * mask * weights).sum() / mask.sum()


def evaluate(player: policy_eval.Player, tasks: list[dict[str, Any]], samples: int, seed: int) -> dict[str, float]:
    player.model.eval()
    episodes = player.play(tasks, samples=samples, sampling=policy_eval.Sampling(seed=seed))
    return policy_eval.summary(episodes)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--group", type=int, default=8, help="samples per task (GRPO group)")
    parser.add_argument("--tasks-per-step", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-samples", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write the curve here as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    player = policy_eval.Player(model, warmstart.load_tokenizer(args.model), warmstart.HarnessSpec.load())
    train_tasks = policy_eval.load_tasks(split="train")
    eval_tasks = policy_eval.load_tasks(split="eval")
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    rng = random.Random(args.seed)
    curve: list[dict[str, Any]] = []
    started = time.monotonic()

    def held_out(step: int) -> None:
        result = evaluate(player, eval_tasks, args.eval_samples, seed=10_000 + step)
        curve.append({"step": step, "eval": result, "seconds": round(time.monotonic() - started, 1)})
        print(f"step {step:3d}  EVAL pass {result['pass_rate']:.3f}  lookup {result['lookup_rate']:.3f}  "
              f"pass|lookup {result['pass_rate_with_lookup']:.3f}", flush=True)

    held_out(0)
    for step in range(1, args.steps + 1):
        model.eval()
        tasks = rng.sample(train_tasks, args.tasks_per_step)
        episodes = player.play(tasks, samples=args.group, sampling=policy_eval.Sampling(seed=step))
        rewards = [e.reward for e in episodes]
        model.train()
        loss = policy_loss(model, episodes, advantages(rewards, args.group), player.pad_id)
        if loss is not None:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        summary = policy_eval.summary(episodes)
        curve.append({"step": step, "train": summary})
        print(f"step {step:3d}  reward {summary['pass_rate']:.3f}  lookup {summary['lookup_rate']:.3f}  "
              f"t {time.monotonic() - started:.0f}s", flush=True)
        if step % args.eval_every == 0:
            held_out(step)
    if args.out is not None:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "curve": curve}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
