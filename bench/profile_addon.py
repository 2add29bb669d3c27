"""Bench-only mitmproxy addon: profiles the sidecar process it runs in.

Run the sidecar with it, as ``openforge sidecar`` runs but with this addon
next to the capture addon::

    python bench/profile_addon.py --profile-out sidecar.pstats -- <openforge sidecar flags>

With ``--profile-out`` the event-loop thread runs under cProfile from
``running`` to ``done`` and the stats are dumped there. With
``--tracemalloc-out`` Python allocations are traced and the snapshot taken
when the most memory was in use is written there (top lines by size).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import sys
import tracemalloc
from pathlib import Path

from openforge_sidecar import cli


class Profile:
    def __init__(self, *, profile_out: Path | None, tracemalloc_out: Path | None) -> None:
        self._profile_out = profile_out
        self._tracemalloc_out = tracemalloc_out
        self._profiler: cProfile.Profile | None = None
        self._watch: asyncio.Task[None] | None = None
        self._best: tracemalloc.Snapshot | None = None
        self._best_size = 0

    def running(self) -> None:
        if self._profile_out is not None:
            self._profiler = cProfile.Profile()
            self._profiler.enable()
        if self._tracemalloc_out is not None:
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
        if self._profiler is not None and self._profile_out is not None:
            self._profiler.disable()
            self._profiler.dump_stats(self._profile_out)
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        if self._best is not None and self._tracemalloc_out is not None:
            stats = self._best.statistics("traceback")[:15]
            lines = [f"peak traced: {self._best_size / 1e6:.1f} MB"]
            for stat in stats:
                lines.append(f"{stat.size / 1e6:8.2f} MB in {stat.count} blocks")
                lines.extend("    " + line for line in stat.traceback.format()[-6:])
            self._tracemalloc_out.write_text("\n".join(lines) + "\n")


def main(argv: list[str]) -> int:
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile-out", type=Path, default=None)
    parser.add_argument("--tracemalloc-out", type=Path, default=None)
    args = parser.parse_args(argv[:cut])
    profile = Profile(profile_out=args.profile_out, tracemalloc_out=args.tracemalloc_out)
    return cli.run(cli.build_parser().parse_args(argv[cut + 1 :]), extra_addons=[profile])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
