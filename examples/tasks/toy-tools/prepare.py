"""Write a task's files (its colors.json database) into the agent's working directory.

python prepare.py --task-file tasks.jsonl --task-id train-000 --workdir DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import toytools


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Set up a toy-tools task's working directory.")
    parser.add_argument("--task-file", type=Path, default=toytools.TASKS_PATH)
    parser.add_argument("--task-id", required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args(argv)
    for path in toytools.prepare(args.workdir, toytools.load_task(args.task_file, args.task_id)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
