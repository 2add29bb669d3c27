"""Grade a toy-tools task: reads the agent's final answer, prints one JSON line.

    python grade.py --task-file tasks.jsonl --task-id train-000 --workdir DIR [--answer-file F]

The answer is read from ``answer.txt`` in the working directory (where the
ReAct harness writes its final answer) unless ``--answer-file`` names
another file. A missing answer file grades 0. Output:
``{"reward": 1.0|0.0, "task_id": ..., "answer": <normalized or null>, "expected": ...}``.
Exit status 0 whenever a grade was printed, 2 on bad arguments or task files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import toytools


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Grade a toy-tools task.")
    parser.add_argument("--task-file", type=Path, default=toytools.TASKS_PATH)
    parser.add_argument("--task-id", required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--answer-file", type=Path, help="default: WORKDIR/answer.txt")
    args = parser.parse_args(argv)
    try:
        task = toytools.load_task(args.task_file, args.task_id)
    except (OSError, ValueError, KeyError) as error:
        print(f"grade.py: {error}", file=sys.stderr)
        return 2
    answer_file = args.answer_file or args.workdir / toytools.ANSWER_FILE
    answer = answer_file.read_text(encoding="utf-8") if answer_file.is_file() else None
    print(json.dumps(toytools.grade(answer, task)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
