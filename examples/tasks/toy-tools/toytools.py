"""The toy tool-calling task set: what color is an item? (stdlib only).

Each task asks for the color of a made-up item. The answer is in a small
database file (``colors.json``) written into the task's working directory;
an agent reads it with the harness's ``lookup_color`` tool. The same few
items recur across tasks with different colors, so nothing in an item's
name tells its color: an agent that answers without the tool guesses one of
the palette's colors (one in twelve).

The database holds the asked item only, so ``lookup_color`` may be called
with or without ``{"item": name}``. That is deliberate: a policy of a
million parameters, warm-started in two CPU minutes, learns to copy the
color from the tool's answer (six tokens back) but not to copy the item's
name from the question into the call (some 45 tokens back, behind a
336-token system turn) -- measured; see README.md.

The constants (prompt, palette, database name, item names) live in
``spec.json`` beside this file, read by this module and by the trainer's
warm-start; ``tasks.jsonl`` is generated from them by ``generate.py``.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SPEC_PATH = HERE / "spec.json"
TASKS_PATH = HERE / "tasks.jsonl"
ANSWER_FILE = "answer.txt"


def load_spec(path: Path = SPEC_PATH) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    for key in ("prompt", "colors", "database", "items"):
        if key not in spec:
            raise ValueError(f"{path}: field {key!r} is missing")
    return spec


def make_tasks(*, seed: int = 0, train: int = 64, held_out: int = 16) -> list[dict[str, Any]]:
    """``train`` + ``held_out`` tasks over the spec's few items.

    Items recur across tasks with different colors, so an item's name says
    nothing about the answer: no (item, color) pair is asked twice, in either
    split. Within a split the answers are spread evenly over the palette
    (then shuffled), so no constant answer beats one in ``len(colors)``.
    """
    spec = load_spec()
    rng = random.Random(seed)
    asked: set[tuple[str, str]] = set()
    tasks = []
    for split, count in (("train", train), ("eval", held_out)):
        pairs = _pairs(rng, spec, count, asked)
        for number, (item, answer) in enumerate(pairs):
            tasks.append(_task(spec, f"{split}-{number:03d}", split, item, answer))
    return tasks


def _pairs(
    rng: random.Random, spec: dict[str, Any], count: int, asked: set[tuple[str, str]]
) -> list[tuple[str, str]]:
    """``count`` new (item, color) pairs; items, and colors, used equally often (+-1).

    Balanced lists of items and colors are shuffled, then colors are swapped
    between positions until no pair repeats or was asked before.
    """
    items, colors = spec["items"], spec["colors"]
    chosen = [items[i % len(items)] for i in range(count)]
    answers = [colors[i % len(colors)] for i in range(count)]
    rng.shuffle(chosen)
    rng.shuffle(answers)
    for _ in range(100 * count):
        pairs = list(zip(chosen, answers, strict=True))
        seen: set[tuple[str, str]] = set()
        bad = []
        for index, pair in enumerate(pairs):
            if pair in seen or pair in asked:
                bad.append(index)
            seen.add(pair)
        if not bad:
            asked.update(pairs)
            return pairs
        index, other = rng.choice(bad), rng.randrange(count)
        answers[index], answers[other] = answers[other], answers[index]
    raise ValueError(f"cannot draw {count} new (item, color) pairs from spec.json; add items")


def _task(spec: dict[str, Any], task_id: str, split: str, item: str, answer: str) -> dict[str, Any]:
    database = {"items": {item: answer}}
    return {
        "id": task_id,
        "split": split,
        "prompt": spec["prompt"].replace("{item}", item),
        "item": item,
        "answer": database["items"][item],
        "files": {spec["database"]: json.dumps(database, indent=2) + "\n"},
    }


def write_tasks(path: Path, tasks: list[dict[str, Any]]) -> None:
    lines = [json.dumps(task, sort_keys=True) for task in tasks]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def load_task(task_file: Path, task_id: str) -> dict[str, Any]:
    with task_file.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            task: dict[str, Any] = json.loads(line)
            if not isinstance(task, dict) or "id" not in task:
                raise ValueError(f"{task_file}:{number}: a task must be an object with an 'id'")
            if task["id"] == task_id:
                return task
    raise KeyError(f"{task_file}: no task with id {task_id!r}")


def prepare(workdir: Path, task: dict[str, Any]) -> list[Path]:
    """Write the task's files into ``workdir``; refuse paths that leave it."""
    workdir.mkdir(parents=True, exist_ok=True)
    root = workdir.resolve()
    written = []
    for relative, text in sorted(task.get("files", {}).items()):
        path = (root / relative).resolve()
        if not path.is_relative_to(root):
            raise ValueError(f"task {task['id']}: file path {relative!r} leaves the workdir")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def normalize(answer: str) -> str:
    """Lower case, surrounding whitespace, quotes and final punctuation removed."""
    return answer.strip().strip(string.whitespace + "\"'`.!").lower()


def grade(answer: str | None, task: dict[str, Any]) -> dict[str, Any]:
    """Reward 1.0 when the final answer is exactly the item's color, else 0.0."""
    given = None if answer is None else normalize(answer)
    return {
        "reward": 1.0 if given == task["answer"] else 0.0,
        "task_id": task["id"],
        "answer": given,
        "expected": task["answer"],
    }
