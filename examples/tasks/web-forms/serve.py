"""Serve the web-forms site for one task, optionally around the harness that works on it.

    python serve.py --task-id ID --workdir DIR -- COMMAND [ARG...]
    python serve.py --task-id ID --workdir DIR            # serve until interrupted

The site listens on 127.0.0.1 (a free port unless ``--port``) and logs every
page view and form submission to ``DIR/web-forms-log.jsonl``, which
``grade.py`` reads. With a command, the command runs with ``WEB_TASK_URL``
set to the task's start page (and ``WEB_TASK_PROMPT`` to its prompt), the
site stops when it exits, and this script exits with its status: the task
reaches the harness this way. Without one, the start URL is printed and the
site serves until Ctrl-C (for trying a task by hand).

Exit status: the command's; 2 on bad arguments or task files.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType

import webforms


def main(argv: list[str]) -> int:
    command: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, command = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(description="Serve the web-forms site for one task.")
    parser.add_argument("--task-file", type=Path, default=webforms.TASKS_PATH)
    parser.add_argument("--task-id", required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    args = parser.parse_args(argv)
    try:
        task = webforms.load_task(args.task_file, args.task_id)
    except (OSError, ValueError, KeyError) as error:
        print(f"serve.py: {error}", file=sys.stderr)
        return 2
    with webforms.Site(args.workdir, port=args.port) as site:
        start_url = site.url + task["start"]
        if not command:
            print(start_url, flush=True)
            threading.Event().wait()
            return 0
        env = {**os.environ, "WEB_TASK_URL": start_url, "WEB_TASK_PROMPT": task["prompt"]}
        return run(command, env)


def run(command: list[str], env: dict[str, str]) -> int:
    """Run the harness; a SIGTERM or SIGINT to this script is passed on to it."""
    child = subprocess.Popen(command, env=env)

    def forward(signum: int, frame: FrameType | None) -> None:
        child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    return child.wait()


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit(130)
