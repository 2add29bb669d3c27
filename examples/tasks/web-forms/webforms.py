"""The web-forms task set: a tiny web site on 127.0.0.1 and its grader (stdlib only).

A GUI agent gets a task in words ("Type ... into the "Name" field, then click
the "Send" button") and a browser showing one page of this site. The site
records what happens to it, one JSON line per request, in a log file in the
task's working directory:

* ``{"event": "view", "path": "/orders/1042", "query": {}}`` for every page shown;
* ``{"event": "submit", "form": "contact", "fields": {"name": ..., ...}}`` for
  every form posted (fields as the browser sent them; an unchecked checkbox
  sends nothing).

The grader reads only that log, so what counts is what the browser really
did, never what the agent says it did. A task's ``expect`` is one of:

* ``{"submit": {"form": F, "fields": {...}}}``: the *last* submission of form
  ``F`` carries exactly these values (surrounding whitespace ignored), and
  every other field it carries is empty;
* ``{"page": P}``: the last page viewed is ``P`` (path and query, e.g.
  ``/search/results?q=blue+kettle``).

Task rows (``tasks.jsonl``): ``{"id", "prompt", "start", "expect"}``, where
``start`` is the path the browser opens first.
"""

from __future__ import annotations

import html
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

HERE = Path(__file__).resolve().parent
TASKS_PATH = HERE / "tasks.jsonl"
LOG_FILE = "web-forms-log.jsonl"
ORDERS = {"1041": "a blue kettle", "1042": "two tea cups", "1043": "a bread knife"}

STYLE = """
body { font-family: "DejaVu Sans", sans-serif; margin: 24px; font-size: 18px; }
nav a { margin-right: 18px; }
label { display: block; margin-top: 14px; }
input[type=text], input[type=email], input[type=search], textarea { width: 320px; \
font-size: 18px; padding: 4px; }
input[type=checkbox] { width: 20px; height: 20px; }
button { display: block; margin-top: 18px; font-size: 18px; padding: 6px 18px; }
"""


# --- tasks and grading ----------------------------------------------------------------


def load_task(path: Path, task_id: str) -> dict[str, Any]:
    """The task row with ``id`` equal to ``task_id``; names the file and line at fault."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except ValueError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error})") from error
        if isinstance(task, dict) and task.get("id") == task_id:
            check_task(task, f"{path}:{number}")
            return task
    raise KeyError(f"{path}: no task with id {task_id!r}")


def check_task(task: dict[str, Any], where: str) -> None:
    for key in ("prompt", "start", "expect"):
        if key not in task:
            raise ValueError(f"{where}: field {key!r} is missing")
    if not str(task["start"]).startswith("/"):
        raise ValueError(f"{where}: field 'start' must be a path starting with '/'")
    expect = task["expect"]
    if not isinstance(expect, dict) or len(expect) != 1 or not ({"submit", "page"} & expect.keys()):
        raise ValueError(f'{where}: field \'expect\' must be {{"submit": ...}} or {{"page": ...}}')
    submit = expect.get("submit")
    if submit is not None and not (isinstance(submit, dict) and isinstance(submit.get("form"), str)
                                   and isinstance(submit.get("fields"), dict)):  # fmt: skip
        raise ValueError(
            f"{where}: field 'expect.submit' needs a 'form' name and a 'fields' object"
        )


def read_log(workdir: Path) -> list[dict[str, Any]]:
    """The site's events in the order they happened ([] when the site never ran)."""
    path = workdir / LOG_FILE
    if not path.is_file():
        return []
    return [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]


def grade(task: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"reward": 1.0 or 0.0, "task_id", "reason"}`` for a task and the site's events."""
    expect = task["expect"]
    if "page" in expect:
        views = [page_of(e) for e in events if e.get("event") == "view"]
        last = views[-1] if views else None
        ok = last == expect["page"]
        reason = (
            "reached the page" if ok else f"last page viewed is {last!r}, not {expect['page']!r}"
        )
    else:
        ok, reason = _grade_submit(expect["submit"], events)
    return {"reward": 1.0 if ok else 0.0, "task_id": task["id"], "reason": reason}


def page_of(event: dict[str, Any]) -> str:
    """A view event's path with its query, as a task's ``expect.page`` writes it."""
    query = event.get("query") or {}
    return str(event["path"]) + ("?" + urlencode(query) if query else "")


def _grade_submit(expected: dict[str, Any], events: list[dict[str, Any]]) -> tuple[bool, str]:
    form = expected["form"]
    posted = [e for e in events if e.get("event") == "submit" and e.get("form") == form]
    if not posted:
        return False, f"form {form!r} was never submitted"
    fields: dict[str, str] = posted[-1].get("fields") or {}
    want = {name: str(value).strip() for name, value in expected["fields"].items()}
    for name in sorted(want.keys() | fields.keys()):
        got = str(fields.get(name, "")).strip()
        if got != want.get(name, ""):
            return (
                False,
                f"form {form!r} field {name!r} is {got!r}, expected {want.get(name, '')!r}",
            )
    return True, f"form {form!r} submitted with the right values"


# --- the site -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Page:
    title: str
    body: str
    status: HTTPStatus = HTTPStatus.OK


def render(page: Page) -> bytes:
    nav = "".join(f'<a href="{href}">{name}</a>' for href, name in NAV)
    return (
        "<!doctype html><html><head><meta charset=utf-8>"
        f"<title>{html.escape(page.title)}</title><style>{STYLE}</style></head>"
        f"<body><nav>{nav}</nav><h1>{html.escape(page.title)}</h1>{page.body}</body></html>"
    ).encode()


NAV = (("/", "Home"), ("/contact", "Contact"), ("/newsletter", "Newsletter"),
       ("/orders", "Orders"), ("/drafts", "Drafts"), ("/search", "Search"))  # fmt: skip


def _field(label: str, name: str, kind: str = "text") -> str:
    return f'<label for="{name}">{label}</label><input id="{name}" name="{name}" type="{kind}">'


def get_page(path: str, query: dict[str, str], state: dict[str, Any]) -> Page:
    """The page at ``path`` (GET), or a 404 page."""
    if path == "/":
        return Page("Web forms", "<p>Pick a page from the menu.</p>")
    if path == "/contact":
        body = (_field("Name", "name") + _field("Email", "email", "email")
                + '<label for="message">Message</label>'
                  '<textarea id="message" name="message" rows="3"></textarea>'
                + "<button type=submit>Send</button>")  # fmt: skip
        return Page("Contact us", f'<form method="post" action="/contact">{body}</form>')
    if path == "/newsletter":
        body = (_field("Email", "email", "email")
                + '<label><input type="checkbox" name="digest" id="digest">Weekly digest</label>'
                + "<button type=submit>Subscribe</button>")  # fmt: skip
        return Page("Newsletter", f'<form method="post" action="/newsletter">{body}</form>')
    if path == "/orders":
        items = "".join(f'<li><a href="/orders/{n}">Order {n}</a></li>' for n in ORDERS)
        return Page("Orders", f"<ul>{items}</ul>")
    if path.startswith("/orders/") and path.removeprefix("/orders/") in ORDERS:
        number = path.removeprefix("/orders/")
        return Page(f"Order {number}", f"<p>Order {number}: {ORDERS[number]}, shipped.</p>")
    if path == "/drafts":
        if state.get("draft_deleted"):
            return Page("Drafts", "<p>No drafts.</p>")
        return Page("Drafts", '<p>Draft: "Quarterly report"</p>'
                    '<form method="get" action="/drafts/confirm">'
                    '<button type=submit>Delete draft</button></form>')  # fmt: skip
    if path == "/drafts/confirm":
        return Page("Delete the draft?", '<form method="post" action="/drafts/delete">'
                    '<button type=submit name="answer" value="confirm">Confirm</button> '
                    '<button type=submit name="answer" value="cancel">Cancel</button>'
                    '</form>')  # fmt: skip
    if path == "/search":
        field = '<label for="q">Search</label><input id="q" name="q" type="search">'
        return Page("Search", f'<form method="get" action="/search/results">{field}</form>')
    if path == "/search/results":
        term = query.get("q", "")
        return Page("Search results", f"<p>No results for {html.escape(term)!s}.</p>")
    return Page("Not found", "<p>There is no such page.</p>", HTTPStatus.NOT_FOUND)


def post_page(path: str, fields: dict[str, str], state: dict[str, Any]) -> tuple[str, Page]:
    """The form a POST submits and the page it answers with."""
    if path == "/contact":
        return "contact", Page("Thank you", "<p>Your message was sent.</p>")
    if path == "/newsletter":
        return "newsletter", Page("Subscribed", "<p>You are subscribed.</p>")
    if path == "/drafts/delete":
        if fields.get("answer") == "confirm":
            state["draft_deleted"] = True
            return "drafts-delete", Page("Draft deleted", "<p>The draft was deleted.</p>")
        return "drafts-delete", Page("Drafts", "<p>Nothing was deleted.</p>")
    return "", Page("Not found", "<p>There is no such form.</p>", HTTPStatus.NOT_FOUND)


class Site:
    """The site's server and event log; ``with Site(workdir) as site: site.url``."""

    def __init__(self, workdir: Path, *, port: int = 0) -> None:
        self.log_path = workdir / LOG_FILE
        self.state: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Site:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def record(self, event: dict[str, Any]) -> None:
        with self._lock, self.log_path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(event, ensure_ascii=False) + "\n")


def _handler(site: Site) -> Callable[..., BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            if parts.path == "/favicon.ico":
                self._send(HTTPStatus.NO_CONTENT, b"")
                return
            query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
            page = get_page(parts.path, query, site.state)
            site.record({"event": "view", "path": parts.path, "query": query})
            self._send(page.status, render(page))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode("utf-8", errors="replace")
            fields = {k: v[-1] for k, v in parse_qs(body, keep_blank_values=True).items()}
            path = urlsplit(self.path).path
            form, page = post_page(path, fields, site.state)
            if form:
                site.record({"event": "submit", "form": form, "fields": fields})
            site.record({"event": "view", "path": path, "query": {}})
            self._send(page.status, render(page))

        def _send(self, status: HTTPStatus, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the event log is the record; keep the harness's output clean

    return Handler
