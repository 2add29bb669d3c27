"""Profile the sidecar under the proxy-overhead workload: where its time and memory go.

Starts the test engine and the sidecar (as ``openforge sidecar`` runs it, plus
``bench/profile_addon.py``), sends the workload one call at a time and then
from 50 concurrent clients, stops the sidecar so the addon writes its
results, and prints the top functions by own time and by cumulative time
(cProfile, event-loop thread), or the largest allocations at peak memory
(``--memory``, tracemalloc; slow, for where, not how much).

    python bench/profile_sidecar.py [--calls 400] [--memory]
"""

from __future__ import annotations

import argparse
import asyncio
import pstats
import sys
import tempfile
from pathlib import Path

import clients
import servers
import workload


async def load(url: str, calls: int, concurrency: int) -> None:
    chat = [
        clients.Target(url + "/v1/chat/completions", workload.chat_body(s, stream=st), st, "chat")
        for s in workload.SCENARIOS
        for st in (True, False)
    ]
    async with clients.client(1) as http:
        for index in range(calls):
            await clients.timed_call(http, chat[index % len(chat)])
    async with clients.client(concurrency) as http:
        await clients.concurrent_calls(
            http, chat[::2], clients=concurrency, max_calls=calls, max_seconds=30
        )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--calls", type=int, default=400, help="calls sent sequentially, then as many concurrently"
    )
    parser.add_argument(
        "--memory", action="store_true", help="trace allocations instead of profiling time"
    )
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--save", type=Path, default=None, help="keep the profile (pstats) here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="openforge-profile-") as tmp:
        work = Path(tmp)
        out = work / ("tracemalloc.txt" if args.memory else "sidecar.pstats")
        flag = "--tracemalloc-out" if args.memory else "--profile-out"
        with servers.Servers(work) as procs:
            engine = procs.engine(token_delay_ms=0)
            sidecar = procs.profiled_sidecar(engine, [flag, str(out)])
            asyncio.run(load(sidecar.url, args.calls, 50))
            sidecar.stop(timeout=60)
        if not out.exists():
            print(f"the sidecar wrote no profile; its log:\n{sidecar.tail()}", file=sys.stderr)
            return 1
        if args.memory:
            print(out.read_text())
            return 0
        if args.save is not None:
            args.save.write_bytes(out.read_bytes())
        stats = pstats.Stats(str(out))
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
