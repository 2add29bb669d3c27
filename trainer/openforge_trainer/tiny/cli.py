"""``openforge model``: build, warm-start and evaluate the tiny offline policy.

openforge model build --out DIR [--seed 0] [--size tiny]
openforge model warmstart --model DIR --out DIR [--steps 600] [--seed 0]
openforge model eval --model DIR [--split eval] [--samples 8] [--temperature 1.0]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from openforge import cli as front_door

from openforge_trainer.tiny import model_build, policy_eval, warmstart


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="openforge model", description=front_door.description(__doc__)
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="initialise a tiny Qwen2 policy from a seed")
    build.add_argument("--out", type=Path, required=True, help="directory to write into")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--size", choices=sorted(model_build.SIZES), default="tiny")
    start = commands.add_parser("warmstart", help="fine-tune on toy-tools demonstrations")
    start.add_argument("--model", type=Path, required=True, help="the model to start from")
    start.add_argument("--out", type=Path, required=True, help="directory to write into")
    defaults = warmstart.WarmstartConfig()
    start.add_argument("--steps", type=int, default=defaults.steps)
    start.add_argument("--short-steps", type=int, default=defaults.short_steps)
    start.add_argument("--seed", type=int, default=defaults.seed)
    start.add_argument("--direct-fraction", type=float, default=defaults.direct_fraction)
    start.add_argument("--harness", type=Path, default=warmstart.DEFAULT_HARNESS)
    start.add_argument("--task-spec", type=Path, default=warmstart.DEFAULT_TASK_SPEC)
    evaluate = commands.add_parser("eval", help="pass rate on the toy-tools tasks, in-process")
    evaluate.add_argument("--model", type=Path, required=True)
    evaluate.add_argument("--tasks", type=Path, default=policy_eval.DEFAULT_TASKS)
    evaluate.add_argument("--split", default="eval", help="train, eval, or all")
    evaluate.add_argument("--samples", type=int, default=8, help="episodes per task")
    evaluate.add_argument("--temperature", type=float, default=1.0)
    evaluate.add_argument("--seed", type=int, default=0)
    evaluate.add_argument("--harness", type=Path, default=warmstart.DEFAULT_HARNESS)
    for command in (start, evaluate):
        command.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.command == "build":
        print(model_build.build_model(args.out, seed=args.seed, size=args.size))
        return 0
    torch.set_num_threads(args.threads)
    if args.command == "warmstart":
        config = warmstart.WarmstartConfig(
            steps=args.steps,
            short_steps=min(args.short_steps, args.steps),
            seed=args.seed,
            direct_fraction=args.direct_fraction,
        )
        result = warmstart.warmstart(
            args.model,
            args.out,
            config=config,
            harness_path=args.harness,
            task_spec_path=args.task_spec,
            log_every=50,
        )
        print(
            json.dumps(
                {
                    "out": str(args.out),
                    "seconds": round(result.seconds, 1),
                    "final_loss": result.losses[-1],
                }
            )
        )
        return 0
    model = model_build.load_model(args.model)
    player = policy_eval.Player(
        model,
        warmstart.load_tokenizer(args.model),
        harness=warmstart.HarnessSpec.load(args.harness),
    )
    tasks = policy_eval.load_tasks(args.tasks, None if args.split == "all" else args.split)
    sampling = policy_eval.Sampling(temperature=args.temperature, seed=args.seed)
    print(
        json.dumps(policy_eval.summary(player.play(tasks, samples=args.samples, sampling=sampling)))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
