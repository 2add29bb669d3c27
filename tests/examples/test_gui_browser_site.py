"""The web-forms task set: its site over real HTTP, its grader, and serve.py around a command.

No browser here (tests/examples/test_gui_browser.py drives Chromium): requests
are made the way a browser makes them, form-encoded, and the grader reads the
log the site wrote.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks" / "web-forms"
sys.path.insert(0, str(TASKS))
import webforms  # noqa: E402

TASK_ROWS = [json.loads(line) for line in (TASKS / "tasks.jsonl").read_text().splitlines()]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def post(url: str, fields: dict[str, str]) -> str:
    data = urllib.parse.urlencode(fields).encode()
    with urllib.request.urlopen(url, data=data, timeout=10) as response:
        return str(response.read().decode())


def task(task_id: str) -> dict[str, Any]:
    return next(t for t in TASK_ROWS if t["id"] == task_id)


def script(
    name: str, *args: str | Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TASKS / name), *map(str, args)],
                          capture_output=True, text=True, timeout=30, env=env,
                          check=False)  # fmt: skip


@pytest.mark.parametrize("row", TASK_ROWS, ids=lambda t: t["id"])
def test_every_task_is_valid_and_its_start_page_exists(row: dict[str, Any], tmp_path: Path) -> None:
    webforms.check_task(row, row["id"])
    with webforms.Site(tmp_path) as site:
        status, page = get(site.url + row["start"])
    assert status == 200 and ("<form" in page or "<a href" in page)


def test_the_site_logs_views_and_submissions_and_keeps_state(tmp_path: Path) -> None:
    with webforms.Site(tmp_path) as site:
        assert get(site.url + "/orders/1042")[0] == 200
        assert get(site.url + "/nowhere")[0] == 404
        assert "Thank you" in post(
            site.url + "/contact", {"name": " Ada ", "email": "a@b.c", "message": ""}
        )
        assert "Quarterly report" in get(site.url + "/drafts")[1]
        post(site.url + "/drafts/delete", {"answer": "confirm"})
        assert "No drafts." in get(site.url + "/drafts")[1]
        get(site.url + "/search/results?q=blue+kettle")
    events = webforms.read_log(tmp_path)
    assert events[:3] == [
        {"event": "view", "path": "/orders/1042", "query": {}},
        {"event": "view", "path": "/nowhere", "query": {}},
        {
            "event": "submit",
            "form": "contact",
            "fields": {"name": " Ada ", "email": "a@b.c", "message": ""},
        },
    ]
    assert webforms.page_of(events[-1]) == "/search/results?q=blue+kettle"


def test_a_submission_grades_on_its_last_values_and_stray_fields() -> None:
    contact = task("contact-ada")
    submit = {"event": "submit", "form": "contact"}
    right = {
        **submit,
        "fields": {"name": "Ada Lovelace ", "email": "ada@example.org", "message": ""},
    }
    assert webforms.grade(contact, [right])["reward"] == 1.0
    wrong_last = [right, {**submit, "fields": {"name": "Ada", "email": "ada@example.org"}}]
    assert webforms.grade(contact, wrong_last) == {
        "reward": 0.0, "task_id": "contact-ada",
        "reason": "form 'contact' field 'name' is 'Ada', expected 'Ada Lovelace'",
    }  # fmt: skip
    stray = {**submit, "fields": {**right["fields"], "message": "hi"}}
    assert (
        webforms.grade(contact, [stray])["reason"]
        == "form 'contact' field 'message' is 'hi', expected ''"
    )
    assert webforms.grade(contact, [])["reason"] == "form 'contact' was never submitted"
    unchecked = {"event": "submit", "form": "newsletter", "fields": {"email": "alan@example.org"}}
    assert webforms.grade(task("newsletter-digest"), [unchecked])["reward"] == 0.0


def test_a_page_task_grades_on_the_last_page_viewed() -> None:
    order = task("order-1042")
    view = {"event": "view", "query": {}}
    assert (
        webforms.grade(order, [{**view, "path": "/orders"}, {**view, "path": "/orders/1042"}])[
            "reward"
        ]
        == 1.0
    )
    assert (
        webforms.grade(order, [{**view, "path": "/orders/1042"}, {**view, "path": "/"}])["reward"]
        == 0.0
    )
    assert webforms.grade(order, [])["reason"] == "last page viewed is None, not '/orders/1042'"


def test_bad_task_rows_name_the_field() -> None:
    with pytest.raises(ValueError, match="x: field 'expect' is missing"):
        webforms.check_task({"prompt": "p", "start": "/"}, "x")
    with pytest.raises(ValueError, match="field 'start' must be a path"):
        webforms.check_task({"prompt": "p", "start": "http://x/", "expect": {"page": "/"}}, "x")
    with pytest.raises(ValueError, match=r"'expect\.submit' needs a 'form' name"):
        webforms.check_task(
            {"prompt": "p", "start": "/", "expect": {"submit": {"fields": {}}}}, "x"
        )


def test_serve_runs_the_harness_with_the_task_and_grade_reads_the_log(tmp_path: Path) -> None:
    fetch = ("import os, sys, urllib.request; "
             "print(os.environ['WEB_TASK_PROMPT']); "
             "urllib.request.urlopen(os.environ['WEB_TASK_URL'] + '/1043').read(); "
             "sys.exit(3)")  # fmt: skip
    done = script(
        "serve.py",
        "--task-id",
        "order-1043",
        "--workdir",
        tmp_path,
        "--",
        sys.executable,
        "-c",
        fetch,
    )
    assert done.returncode == 3, done.stderr  # the command's own status
    assert done.stdout.strip() == task("order-1043")["prompt"]
    graded = script("grade.py", "--task-id", "order-1043", "--workdir", tmp_path)
    assert graded.returncode == 0
    assert json.loads(graded.stdout) == {
        "reward": 1.0,
        "task_id": "order-1043",
        "reason": "reached the page",
    }
    empty = script("grade.py", "--task-id", "order-1043", "--workdir", tmp_path / "nothing")
    assert json.loads(empty.stdout)["reward"] == 0.0


def test_scripts_refuse_an_unknown_task(tmp_path: Path) -> None:
    for name in ("serve.py", "grade.py"):
        done = script(name, "--task-id", "nope", "--workdir", tmp_path)
        assert done.returncode == 2 and "no task with id 'nope'" in done.stderr, (name, done.stderr)
