"""Does policy-gradient RL raise the warm-started tiny policy's pass rate? A probe.

Not the production trainer: a plain on-policy GRPO-style loop (group-relative
advantages, one update per batch, so no ratio or clipping) over episodes
played in-process by :mod:`openforge_trainer.tiny.policy_eval`, token for token as
the ReAct harness and the sidecar would. It exists to find hyperparameters
for the real trainer and to show the curve:

    python scripts/toy_rl_probe.py --model ~/.cache/openforge/models/tiny-react \\
        --steps 30 --lr 5e-4 --group 8 --tasks-per-step 8 --out /tmp/probe.json

It prints one line per step (mean reward of the batch, lookup rate) and, every
``--eval-every`` steps, the held-out pass rate at temperature 1.0.

As ``openforge run examples/harnesses/codex/learn.yaml`` trains (Codex CLI's
requests, the 8 demo tasks x 4 samples every step, the trainer's token mean
over all response tokens, Adam's epsilon as in learn.yaml), one seed:

    python scripts/toy_rl_probe.py --model examples/models/tiny-codex \
        --harness examples/harnesses/codex/harness.json \
        --tasks examples/tasks/toy-tools/demo.jsonl --all-tasks --group 4 \
        --steps 7 --lr 5e-4 --mean-over-all --adam-eps 1e-5 --seed 1 --show

``--show`` prints each step's most common first replies (how a collapse of
the tool-call format was found); ``--kl`` adds veRL's low-variance KL to the
initial policy; ``--no-std`` leaves the group std out of the advantage.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from openforge_trainer.tiny import policy_eval, warmstart
from openforge_trainer.training import update_guard
from transformers import AutoModelForCausalLM


def advantages(rewards: list[float], group: int, *, by_std: bool = True) -> list[float]:
    """GRPO: reward minus its group's mean, over the group's std (0 where all agree).

    ``by_std`` False leaves out the division (Dr. GRPO).
    """
    out = []
    for start in range(0, len(rewards), group):
        chunk = torch.tensor(rewards[start : start + group])
        std = float(chunk.std())
        scale = std + 1e-6 if by_std else 1.0
        out += [0.0] * len(chunk) if std == 0 else ((chunk - chunk.mean()) / scale).tolist()
    return out


def policy_loss(
    model: Any,
    episodes: list[policy_eval.Episode],
    advs: list[float],
    pad_id: int,
    *,
    mean_over_all: bool = False,
    reference: Any = None,
    kl_coef: float = 0.0,
) -> torch.Tensor | None:
    """-sum(A * log p(response tokens)) / number of response tokens (token-level mean).

    The mean is over the episodes with a non-zero advantage, or, with
    ``mean_over_all``, over every episode's response tokens as the trainer's
    token-mean ``agg_loss`` does (uniform groups then dilute the step).
    """
    kept = [(e, a) for e, a in zip(episodes, advs, strict=True) if a != 0.0 or kl_coef > 0]
    if not kept:
        return None
    denominator = sum(sum(e.sequence()[1]) for e in episodes) if mean_over_all else None
    encoded = []
    for episode, _ in kept:
        ids, mask, _ = episode.sequence()
        encoded.append(warmstart.Encoded(ids, mask))
    batch = warmstart.collate(encoded, pad_id)
    nll = warmstart.token_nll(model, batch)
    mask = batch["loss_mask"][:, 1:]
    weights = torch.tensor([a for _, a in kept])[:, None]
    loss = (nll * mask * weights).sum()
    if reference is not None and kl_coef > 0:
        with torch.no_grad():
            reference_nll = warmstart.token_nll(reference, batch)
        log_ratio = (nll - reference_nll).clamp(-20, 20)  # log p_ref - log p
        kl = (torch.exp(log_ratio) - log_ratio - 1).clamp(-10, 10)  # veRL's low_var_kl (k3)
        loss = loss + kl_coef * (kl * mask).sum()
    return loss / (mask.sum() if denominator is None else denominator)


def response_log_probs(
    model: Any, episodes: list[policy_eval.Episode], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each episode's model-token log-probs under ``model`` and their mask,
    [episodes, length - 1]."""
    encoded = []
    for episode in episodes:
        ids, mask, _ = episode.sequence()
        encoded.append(warmstart.Encoded(ids, mask))
    batch = warmstart.collate(encoded, pad_id)
    with torch.no_grad():
        nll = warmstart.token_nll(model, batch)
    return -nll, batch["loss_mask"][:, 1:].float()


def update_size(
    before: torch.Tensor, after: torch.Tensor, mask: torch.Tensor, advs: list[float]
) -> dict[str, float]:
    """How far one update moved the policy on the batch's own tokens.

    ``pos_tok`` and ``kl`` are what the trainer's step guard judges
    (:func:`openforge_trainer.training.update_guard.measure`); the rest are per
    episode: ``pos_shift``/``neg_shift`` the mean change of a positive/negative
    episode's log-likelihood, ``gain`` the advantage-weighted change,
    ``surr`` the token-level importance-ratio surrogate, ``seq_kl`` the k3 KL
    summed per episode, ``seq_shift_max`` the largest change of one episode.
    """
    weights = torch.tensor(advs)
    size = update_guard.measure(
        before, after, mask=mask, advantages=weights[:, None].expand_as(mask)
    )
    log_ratio = (after - before).clamp(-20, 20)
    k3 = (torch.exp(log_ratio) - 1 - log_ratio) * mask
    shift = (log_ratio * mask).sum(1)
    surrogate = (weights[:, None] * (torch.exp(log_ratio) - 1) * mask).sum() / mask.sum()
    positive = weights > 0
    negative = weights < 0
    return {
        "pos_tok": size.positive_shift,
        "surr": float(surrogate),
        "gain": float((weights * shift).sum() / len(advs)),
        "pos_shift": float(shift[positive].mean()) if positive.any() else 0.0,
        "neg_shift": float(shift[negative].mean()) if negative.any() else 0.0,
        "kl": size.kl,
        "seq_kl": float(k3.sum(1).mean()),
        "seq_shift_max": float(shift.abs().max()),
    }


def evaluate(
    player: policy_eval.Player, tasks: list[dict[str, Any]], samples: int, seed: int
) -> dict[str, float]:
    player.model.eval()
    episodes = player.play(tasks, samples=samples, sampling=policy_eval.Sampling(seed=seed))
    return policy_eval.summary(episodes)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
    parser.add_argument(
        "--harness", type=Path, default=warmstart.DEFAULT_HARNESS, help="HarnessSpec JSON"
    )
    parser.add_argument("--tasks", type=Path, default=policy_eval.DEFAULT_TASKS, help="tasks JSONL")
    parser.add_argument(
        "--all-tasks",
        action="store_true",
        help="every task of --tasks each step (as openforge run)",
    )
    parser.add_argument(
        "--show", action="store_true", help="print the batch's most common first replies each step"
    )
    parser.add_argument("--adam-eps", type=float, default=1e-8, help="Adam's epsilon")
    parser.add_argument("--beta1", type=float, default=0.9, help="Adam's beta1 (momentum)")
    parser.add_argument("--kl", type=float, default=0.0, help="KL-to-reference weight (low_var_kl)")
    parser.add_argument(
        "--no-std", action="store_true", help="advantages not divided by the group std (Dr. GRPO)"
    )
    parser.add_argument(
        "--max-kl",
        type=float,
        default=0.0,
        help=(
            "trust region: halve an update (5 times, then drop it) while its batch KL exceeds this"
        ),
    )
    parser.add_argument(
        "--line-search",
        action="store_true",
        help=(
            "halve an update while it lowers the likelihood of "
            "its batch's positive-advantage tokens"
        ),
    )
    parser.add_argument(
        "--mean-over-all", action="store_true", help="token mean over all episodes (the trainer's)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    reference = (
        AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
        if args.kl > 0
        else None
    )
    player = policy_eval.Player(
        model,
        warmstart.load_tokenizer(args.model),
        harness=warmstart.HarnessSpec.load(args.harness),
    )
    train_tasks = policy_eval.load_tasks(args.tasks, None if args.all_tasks else "train")
    eval_tasks = train_tasks if args.all_tasks else policy_eval.load_tasks(args.tasks, "eval")
    optimizer = torch.optim.Adam(
        model.parameters(), lr=args.lr, eps=args.adam_eps, betas=(args.beta1, 0.999)
    )
    rng = random.Random(args.seed)
    curve: list[dict[str, Any]] = []
    started = time.monotonic()

    def held_out(step: int) -> None:
        result = evaluate(player, eval_tasks, args.eval_samples, seed=10_000 + step)
        curve.append(
            {"step": step, "eval": result, "seconds": round(time.monotonic() - started, 1)}
        )
        print(
            f"step {step:3d}  EVAL pass {result['pass_rate']:.3f}  lookup "
            f"{result['lookup_rate']:.3f}  pass|lookup {result['pass_rate_with_lookup']:.3f}",
            flush=True,
        )

    held_out(0)
    for step in range(1, args.steps + 1):
        model.eval()
        tasks = train_tasks if args.all_tasks else rng.sample(train_tasks, args.tasks_per_step)
        episodes = player.play(
            tasks, samples=args.group, sampling=policy_eval.Sampling(seed=args.seed * 1000 + step)
        )
        rewards = [e.reward for e in episodes]
        model.train()
        advs = advantages(rewards, args.group, by_std=not args.no_std)
        loss = policy_loss(
            model,
            episodes,
            advs,
            player.pad_id,
            mean_over_all=args.mean_over_all,
            reference=reference,
            kl_coef=args.kl,
        )
        moved: dict[str, float] = {}
        if loss is not None:
            model.eval()
            before, mask = response_log_probs(model, episodes, player.pad_id)
            old = [p.detach().clone() for p in model.parameters()]
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            after = response_log_probs(model, episodes, player.pad_id)[0]
            moved = {**update_size(before, after, mask, advs), "scale": 1.0}

            def acceptable(moved: dict[str, float]) -> bool:
                if args.line_search:  # the trainer's step guard (update_guard)
                    size = update_guard.StepSize(moved["pos_tok"], moved["kl"])
                    return size.acceptable(args.max_kl)
                return moved["kl"] <= args.max_kl

            # 5 halvings, then the update is dropped
            for scale in update_guard.scales(5) if args.line_search or args.max_kl > 0 else []:
                if acceptable(moved):
                    break
                update_guard.interpolate(
                    list(model.parameters()), old, ratio=scale / moved["scale"]
                )
                after = response_log_probs(model, episodes, player.pad_id)[0]
                moved = {**update_size(before, after, mask, advs), "scale": scale}
        summary = policy_eval.summary(episodes)
        curve.append({"step": step, "train": summary, "update": moved})
        sizes = "  ".join(f"{key} {value:.4f}" for key, value in moved.items())
        print(
            f"step {step:3d}  reward {summary['pass_rate']:.3f}  lookup "
            f"{summary['lookup_rate']:.3f}  t {time.monotonic() - started:.0f}s  {sizes}",
            flush=True,
        )
        if args.show:
            firsts = Counter(
                player.tokenizer.decode(e.turns[0].completion_ids, skip_special_tokens=False)[:90]
                for e in episodes
            )
            for text, count in firsts.most_common(4):
                print(f"      {count:2d}x {text!r}", flush=True)
        if step % args.eval_every == 0:
            held_out(step)
    if args.out is not None:
        args.out.write_text(
            json.dumps(
                {"args": {k: str(v) for k, v in vars(args).items()}, "curve": curve}, indent=1
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
