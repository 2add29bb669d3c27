"""Regenerate tasks.jsonl (deterministic): python generate.py [--seed 0] [--out tasks.jsonl]."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import toytools


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=64, help="number of training tasks")
    parser.add_argument("--eval", type=int, default=16, help="number of held-out tasks")
    parser.add_argument("--out", type=Path, default=toytools.TASKS_PATH)
    args = parser.parse_args(argv)
    tasks = toytools.make_tasks(seed=args.seed, train=args.train, held_out=args.eval)
    toytools.write_tasks(args.out, tasks)
    print(f"wrote {len(tasks)} tasks to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
