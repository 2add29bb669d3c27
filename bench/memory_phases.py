"""Where one large call's memory peaks: the sidecar's RSS per phase of the call.

Runs ``large_requests.py``'s call (a fresh test engine, collector and sidecar, one
small call, then one call of ``--size`` MB) with the sidecar started through
``phase_probe.py``, which publishes the phase it is in (the wrapped function, and the
open ones above it) in a shared page. A thread of this process reads the sidecar's
``/proc/<pid>/statm`` and that page every half millisecond and keeps the highest RSS
seen in each phase; "outside" is mitmproxy's own work (reading the body, sending the
engine's request). Printed: each phase's highest RSS, highest first, and the call's
idle and peak (VmHWM) as ``large_requests.py`` reports them. "outside" is named by the
phases that were open just before it, as the probe publishes them ("outside, after
Capture.request": sending the engine's request), however briefly those were open.

    python bench/memory_phases.py [--size 10] [--shape one|many] [--stream] [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
import mmap
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import large_requests  # this folder's modules, once it is on the path
import phase_probe

PAGE = os.sysconf("SC_PAGE_SIZE")


class Sampler(threading.Thread):
    """The highest RSS (MB) of the sidecar seen in each phase its page names."""

    def __init__(self, label_path: Path, pid_of: Any) -> None:
        super().__init__(daemon=True)
        self._label_path = label_path
        self._pid_of = pid_of
        self.peaks: collections.Counter[str] = collections.Counter()
        self.stopping = threading.Event()

    def run(self) -> None:
        with self._label_path.open("rb") as handle:
            label = mmap.mmap(handle.fileno(), phase_probe.SIZE, access=mmap.ACCESS_READ)
        statm = None
        while not self.stopping.is_set():
            pid = self._pid_of()
            if pid is None:
                time.sleep(0.01)
                continue
            try:
                if statm is None:
                    statm = open(f"/proc/{pid}/statm", "rb")  # noqa: SIM115 (held open)
                statm.seek(0)
                rss = int(statm.read().split()[1]) * PAGE // (1024 * 1024)
            except (OSError, ValueError, IndexError):
                return
            phase = bytes(label[: phase_probe.SIZE]).split(b"\0")[0].decode(errors="replace")
            if phase == "outside":  # before any phase
                phase = "outside, after nothing"
            self.peaks[phase] = max(self.peaks[phase], rss)
            time.sleep(0.0005)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=float, default=10.0, help="body size in MB")
    parser.add_argument("--shape", choices=["one", "many"], default="one")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the results as JSON only")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        label_path = Path(scratch) / "phase"
        label_path.write_bytes(b"\0" * phase_probe.SIZE)
        os.environ["OPENFORGE_PHASES_FILE"] = str(label_path)
        pids: list[int] = []
        sampler = Sampler(label_path, lambda: pids[0] if pids else None)
        original = large_requests.servers.Servers.start

        def start(self: Any, name: str, argv: list[str], port: int) -> Any:
            server = original(self, name, argv, port)
            if name == "sidecar":
                pids.append(server.process.pid)
            return server

        large_requests.servers.Servers.start = start  # type: ignore[method-assign]
        sampler.start()
        workdir = Path(scratch) / "run"
        workdir.mkdir()
        launcher = (sys.executable, str(Path(__file__).resolve().parent / "phase_probe.py"))
        call = large_requests.one(
            None, args.size, workdir, stream=args.stream, export=True, shape=args.shape,
            launcher=launcher,
        )  # fmt: skip
        sampler.stopping.set()
        sampler.join(5)
    result = {"call": call, "phases_mb": dict(sampler.peaks.most_common())}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(
        f"idle {call['idle_mb']} MB, peak {call['peak_mb']} MB (VmHWM), body {call['body_mb']} MB"
    )
    for phase, peak in sampler.peaks.most_common():
        print(f"{peak:6d} MB  {phase}")
    print("--- json ---")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
