"""Grade a web-forms task from the site's event log; prints one JSON line.

    python grade.py --task-id ID --workdir DIR [--task-file tasks.jsonl]

Reads ``DIR/web-forms-log.jsonl`` (written by the site, see ``serve.py``) and
prints ``{"reward": 1.0 or 0.0, "task_id": ..., "reason": ...}``: whether the
form was submitted with the task's values, or the task's page was reached (see
``webforms.grade``). A missing log grades 0. Exit status 0 whenever a grade
was printed, 2 on bad arguments or task files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import webforms


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Grade a web-forms task.")
    parser.add_argument("--task-file", type=Path, default=webforms.TASKS_PATH)
    parser.add_argument("--task-id", required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        task = webforms.load_task(args.task_file, args.task_id)
        events = webforms.read_log(args.workdir)
    except (OSError, ValueError, KeyError) as error:
        print(f"grade.py: {error}", file=sys.stderr)
        return 2
    print(json.dumps(webforms.grade(task, events)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
