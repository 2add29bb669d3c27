"""Memory and time of one large LLM request through the sidecar, by body size.

For each size (1, 10 and 30 MB by default) and each sidecar (this checkout's,
and with ``--compare PATH`` another checkout's, e.g. ``git worktree add
/tmp/old <commit>``), a fresh sidecar in front of a fresh test engine (its
context made large enough to take the prompt) gets one small call to load
its tokenizer, then one Chat Completions call whose user message is the body
size in words. Reported per size and sidecar: the time to the answer, the
sidecar's resident memory before (idle, VmRSS), at its peak (VmHWM) and two
seconds after the answer (VmRSS), and the peak's excess over idle as a
multiple of the body. Sizes run in turn, the sidecars interleaved within each.
Issue 14's target: peak <= 3x the body over idle, back to idle + 10 MB. With
``--stream`` the call is streamed (the engine's echo of the prompt then comes in its
first event, which the sidecar reads as the stream arrives). Each sidecar exports to a
collector of its own, as in a rollout, and "after" is read once the collector has the
call (the record is sent before it is dropped); ``--no-collector`` leaves it out, as
this bench did before 2026-12-05. With ``--shape many`` the body is a conversation of
~2 KB turns instead of one message (a long agent session: every turn is a new piece
for the tokenizer, a new message to parse and to render).

A last row per size, "mitmproxy alone (floor)", sends the same body through
``mitmdump`` with no addon to an upstream that drops it (``--no-floor`` leaves it
out): what the proxy the sidecar is built on takes before any of its work, read the
same way.

    python bench/large_requests.py [--sizes 1 10 30] [--stream] [--shape one|many]
        [--no-collector] [--no-floor] [--compare PATH] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from openforge_sidecar import memory

sys.path.insert(0, str(Path(__file__).resolve().parent))
import servers  # this folder's module, once it is on the path

MB = 1024 * 1024


def body_of(size_mb: float, *, stream: bool = False, shape: str = "one") -> bytes:
    """A Chat Completions body of about ``size_mb``: one user message of that many words
    (``shape`` "one"), or a conversation of ~2 KB turns, users' and the assistant's in
    turn, ending with the user's ("many": a long agent session)."""
    if shape == "one":
        messages = [{"role": "user", "content": "word " * int(size_mb * MB / 5)}]
    else:
        turns = max(1, int(size_mb * MB / 2048)) | 1  # ~2 KB each, odd: the user has the last
        messages = [
            {"role": ("user", "assistant")[i % 2], "content": f"turn {i} " + "word " * 398}
            for i in range(turns)
        ]
    body = {"model": "policy", "max_tokens": 4, "messages": messages, "stream": stream}
    return json.dumps(body).encode()


def one(
    tree: Path | None,
    size_mb: float,
    workdir: Path,
    *,
    stream: bool,
    export: bool,
    shape: str = "one",
    launcher: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """One large call through a fresh sidecar (``tree``: another checkout's; ``launcher``:
    what runs this checkout's CLI, see ``memory_phases.py``)."""
    with servers.Servers(workdir) as procs:
        port = servers.free_port()
        argv = [
            sys.executable,
            "-c",
            servers.ENGINE_MAIN,
            "--port",
            str(port),
            "--max-model-len",
            "1000000000",
        ]
        engine = procs.start("engine", argv, port)
        collector = procs.collector() if export else None
        sidecar = (
            procs.sidecar(
                engine, collector=collector, **({"launcher": launcher} if launcher else {})
            )
            if tree is None
            else procs.sidecar_of(tree, engine, "other", collector=collector)
        )
        return _measured(
            sidecar,
            body_of(size_mb, stream=stream, shape=shape),
            streamed=stream,
            settle=(lambda: exported(sidecar)) if collector is not None else None,
        )


def _measured(
    proxy: servers.Server,
    body: bytes,
    *,
    streamed: bool = False,
    settle: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """``body`` through ``proxy`` after one small call (its tokenizer loaded, if any):
    the time to the answer (a streamed one must end with ``[DONE]``), and the proxy's
    memory before, at its peak and two seconds after (after ``settle``)."""
    warm = {"model": "policy", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    httpx.post(proxy.url + "/v1/chat/completions", json=warm, timeout=120, trust_env=False)
    time.sleep(1)
    idle = servers.memory_kib(proxy.process.pid)
    start = time.monotonic()
    answer = httpx.post(
        proxy.url + "/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
        timeout=900,
        trust_env=False,
    )
    took = time.monotonic() - start
    if answer.status_code != 200 or (streamed and b"data: [DONE]" not in answer.content):
        raise RuntimeError(f"{answer.status_code}: {answer.text[:300]}")
    if settle is not None:
        settle()
    time.sleep(2)
    after = servers.memory_kib(proxy.process.pid)
    return _row(body, took, idle, after)


#: An upstream that reads a request's body, drops it and answers ``{}``.
SINK_MAIN = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Sink(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
"""
#: The row of :func:`floor`.
FLOOR = "mitmproxy alone (floor)"


def floor(size_mb: float, workdir: Path, *, stream: bool, shape: str = "one") -> dict[str, Any]:
    """The same call through mitmproxy alone, forwarded to a sink as it came: what the
    proxy the sidecar is built on costs before any of the sidecar's work. The sink
    answers ``{}`` either way, so ``stream`` changes only the request's flag."""
    with servers.Servers(workdir) as procs:
        port = servers.free_port()
        sink = procs.start("sink", [sys.executable, "-c", SINK_MAIN, str(port)], port)
        # the C allocator's policy the sidecar sets for itself (memory.map_large_buffers)
        policy = {"MALLOC_MMAP_THRESHOLD_": str(memory.MMAP_THRESHOLD_BYTES)}
        proxy = procs.mitmdump(sink, addon=False, env=policy)
        return _measured(proxy, body_of(size_mb, stream=stream, shape=shape))


def _row(body: bytes, took: float, idle: dict[str, int], after: dict[str, int]) -> dict[str, Any]:
    body_mb = len(body) / MB
    idle_mb, peak_mb, after_mb = idle["VmRSS"] / 1024, after["VmHWM"] / 1024, after["VmRSS"] / 1024
    return {
        "body_mb": round(body_mb, 1),
        "seconds": round(took, 1),
        "idle_mb": round(idle_mb),
        "peak_mb": round(peak_mb),
        "after_mb": round(after_mb),
        "peak_over_idle_x_body": round((peak_mb - idle_mb) / body_mb, 1),
        "kept_mb": round(after_mb - idle_mb),
    }


def exported(sidecar: servers.Server, timeout: float = 300) -> None:
    """Wait until the collector has acknowledged every record the sidecar spooled."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = httpx.get(sidecar.url + "/openforge/v1/stats", timeout=30, trust_env=False).json()
        if stats.get("exporter", {}).get("unacked") == 0 and stats["exporter"].get("acked"):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the collector did not acknowledge the call in {timeout} s")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", type=float, nargs="+", default=[1.0, 10.0, 30.0], help="body sizes in MB"
    )
    parser.add_argument(
        "--compare", type=Path, action="append", default=[], help="another checkout's sidecar too"
    )
    parser.add_argument("--stream", action="store_true", help="stream the call's answer")
    parser.add_argument(
        "--shape",
        choices=["one", "many"],
        default="one",
        help="one user message of the body's size, or many ~2 KB turns (see body_of)",
    )
    parser.add_argument(
        "--no-collector", action="store_true", help="spool only: export to no collector"
    )
    parser.add_argument(
        "--no-floor", action="store_true", help="leave out the row of mitmproxy alone"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    args = parser.parse_args(argv)
    trees: list[tuple[str, Path | None]] = [("sidecar", None)] + [
        (f"sidecar@{t}", t) for t in args.compare
    ]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for size in args.sizes:
            for name, tree in trees:
                workdir = Path(scratch) / f"{name.replace('/', '_')}-{size}"
                workdir.mkdir()
                results.setdefault(name, {})[f"{size:g} MB"] = one(
                    tree,
                    size,
                    workdir,
                    stream=args.stream,
                    export=not args.no_collector,
                    shape=args.shape,
                )
            if not args.no_floor:
                workdir = Path(scratch) / f"floor-{size}"
                workdir.mkdir()
                results.setdefault(FLOOR, {})[f"{size:g} MB"] = floor(
                    size, workdir, stream=args.stream, shape=args.shape
                )
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(
        f"{'sidecar':<32} {'size':>6} {'s':>6} {'idle':>6} {'peak':>6} {'after':>6} "
        f"{'peak-idle/body':>15} {'kept':>6}"
    )
    for name, rows in results.items():
        for size, row in rows.items():
            print(
                f"{name:<32} {size:>6} {row['seconds']:>6} {row['idle_mb']:>6} {row['peak_mb']:>6} "
                f"{row['after_mb']:>6} {row['peak_over_idle_x_body']:>14}x {row['kept_mb']:>6}"
            )
    print("--- json ---")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
