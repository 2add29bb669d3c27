"""Bench-only mitmproxy addon: profiles the process it is loaded into.

Load it next to the sidecar's own addon (``mitmdump ... -s bench/profile_addon.py``).
With ``bench_profile_out`` set, the event-loop thread runs under cProfile from
``running`` to ``done`` and the stats are dumped there. With
``bench_tracemalloc_out`` set, Python allocations are traced and the snapshot
taken when the most memory was in use is written there (top lines by size).
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import tracemalloc
from pathlib import Path
from typing import Any

from mitmproxy import ctx


class Profile:
    def __init__(self) -> None:
        self._profiler: cProfile.Profile | None = None
        self._watch: asyncio.Task[None] | None = None
        self._best: tracemalloc.Snapshot | None = None
        self._best_size = 0

    def load(self, loader: Any) -> None:
        loader.add_option(
            "bench_profile_out", str, "", "Write cProfile stats of the event loop thread here."
        )
        loader.add_option(
            "bench_tracemalloc_out", str, "", "Write the top allocations at peak memory here."
        )

    def running(self) -> None:
        if ctx.options.bench_profile_out:
            self._profiler = cProfile.Profile()
            self._profiler.enable()
        if ctx.options.bench_tracemalloc_out:
            tracemalloc.start(8)
            self._watch = asyncio.get_running_loop().create_task(self._watch_peak())

    async def _watch_peak(self) -> None:
        while True:
            current, _ = tracemalloc.get_traced_memory()
            if current > self._best_size:
                self._best_size = current
                self._best = tracemalloc.take_snapshot()
            await asyncio.sleep(0.25)

    async def done(self) -> None:
        if self._profiler is not None:
            self._profiler.disable()
            self._profiler.dump_stats(ctx.options.bench_profile_out)
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        if self._best is not None:
            stats = self._best.statistics("traceback")[:15]
            lines = [f"peak traced: {self._best_size / 1e6:.1f} MB"]
            for stat in stats:
                lines.append(f"{stat.size / 1e6:8.2f} MB in {stat.count} blocks")
                lines.extend("    " + line for line in stat.traceback.format()[-6:])
            Path(ctx.options.bench_tracemalloc_out).write_text("\n".join(lines) + "\n")


addons = [Profile()]
