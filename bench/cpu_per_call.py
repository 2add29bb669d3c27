"""CPU time per call of each proxy, with the calls of all proxies interleaved.

On a shared machine wall-clock figures move with everyone else's load; the
CPU time a proxy process spends per call (user + system, from
``/proc/<pid>/stat``) moves much less, and interleaving the proxies in short
rounds (a few call pairs each, the order rotated) spreads load bursts over
all of them alike. Each round sends the workload's ``tool_call`` then
``text`` call, as a harness would, to each proxy in turn:

* ``mitmdump``: stock mitmdump with the tee addon in front of the test
  engine's own Chat Completions endpoint, sent the same Chat Completions
  calls (as in ``proxy_overhead.py``; before 2026-11-30 it was sent the
  token-in/token-out request the sidecar makes, a smaller body);
* ``sidecar``: ``openforge sidecar`` of this checkout, sent Chat Completions;
* ``sidecar@PATH`` (``--compare PATH``, repeatable): the sidecar of another
  checkout, e.g. ``git worktree add /tmp/old <commit>``, run with that
  tree's ``sidecar/`` and ``common/`` first on ``sys.path``.

Reports per proxy: CPU ms per call, the ``text`` call's latency p50/p99 and
time to first token p50 at the client, and peak RSS (VmHWM).

With ``--clients N`` a second phase follows: every proxy in turn (order
rotated) gets ``--bursts`` bursts of ``--burst-calls`` calls from ``N``
concurrent clients, and each proxy's CPU ms per call under that load, its
calls per second (over its bursts' total time) and its peak RSS after the
load (VmHWM, which then holds the high water under ``N`` calls in flight)
are reported too.

    python bench/cpu_per_call.py [--rounds 80] [--pairs 3] [--json] [--compare PATH]
                                 [--clients 50 --bursts 6 --burst-calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import clients
import httpx
import servers
import workload

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


@dataclass
class Proxy:
    name: str
    server: servers.Server
    targets: list[clients.Target]  # tool_call, text
    cpu_s: float = 0.0
    calls: int = 0
    latency_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    sequential_peak_mb: float = 0.0
    load_cpu_s: float = 0.0
    load_calls: int = 0
    load_wall_s: float = 0.0

    def peak_mb(self) -> float:
        return round(servers.memory_kib(self.server.process.pid)["VmHWM"] * 1024 / 1e6, 1)

    def result(self) -> dict[str, Any]:
        def ms(values: list[float], q: int) -> float:
            return round(statistics.quantiles(values, n=100)[q - 1] * 1000, 2)

        found: dict[str, Any] = {
            "cpu_ms_per_call": round(self.cpu_s / self.calls * 1000, 3),
            "text_latency_ms": {"p50": ms(self.latency_s, 50), "p99": ms(self.latency_s, 99)},
            "text_ttft_ms": {"p50": ms(self.ttft_s, 50)} if self.ttft_s else None,
            "peak_rss_mb": self.sequential_peak_mb or self.peak_mb(),
        }
        if self.load_calls:
            found["load"] = {
                "cpu_ms_per_call": round(self.load_cpu_s / self.load_calls * 1000, 3),
                "calls_per_s": round(self.load_calls / self.load_wall_s, 1),
                "peak_rss_mb": self.peak_mb(),
            }
        return found


def chat_targets(url: str, *, stream: bool, model: str = "policy") -> list[clients.Target]:
    return [
        clients.Target(
            url + "/v1/chat/completions",
            workload.chat_body(s, stream=stream, model=model),
            stream,
            "chat",
        )
        for s in workload.SCENARIOS
    ]


async def measure(proxies: list[Proxy], *, rounds: int, pairs: int, warmup: int) -> None:
    async with clients.client(1) as http:
        for proxy in proxies:
            for index in range(warmup):
                await clients.timed_call(http, proxy.targets[index % 2])
        for index in range(rounds):
            shift = index % len(proxies)
            for proxy in proxies[shift:] + proxies[:shift]:
                before = cpu_seconds(proxy.server.process.pid)
                for _ in range(pairs):
                    await clients.timed_call(http, proxy.targets[0])
                    sample = await clients.timed_call(http, proxy.targets[1])
                    proxy.latency_s.append(sample.latency_s)
                    if sample.ttft_s is not None:
                        proxy.ttft_s.append(sample.ttft_s)
                proxy.cpu_s += cpu_seconds(proxy.server.process.pid) - before
                proxy.calls += 2 * pairs
    for proxy in proxies:
        proxy.sequential_peak_mb = proxy.peak_mb()


async def measure_load(proxies: list[Proxy], *, clients_: int, bursts: int, calls: int) -> None:
    """Bursts of ``calls`` calls from ``clients_`` concurrent clients, proxies interleaved."""
    async with clients.client(clients_) as http:
        for index in range(bursts):
            shift = index % len(proxies)
            for proxy in proxies[shift:] + proxies[:shift]:
                before = cpu_seconds(proxy.server.process.pid)
                done = await clients.concurrent_calls(
                    http, proxy.targets, clients=clients_, max_calls=calls, max_seconds=60.0
                )
                proxy.load_cpu_s += cpu_seconds(proxy.server.process.pid) - before
                proxy.load_calls += done.calls
                proxy.load_wall_s += done.seconds


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    with servers.Servers(workdir) as procs:
        engine = procs.engine(token_delay_ms=0)
        model = httpx.get(engine.url + "/v1/models", trust_env=False).json()["data"][0]["id"]
        stock = procs.mitmdump(engine)
        stream = not args.json
        proxies = [Proxy("mitmdump", stock, chat_targets(stock.url, stream=stream, model=model))]
        sidecar = procs.sidecar(engine)
        proxies.append(Proxy("sidecar", sidecar, chat_targets(sidecar.url, stream=stream)))
        for index, tree in enumerate(args.compare):
            other = procs.sidecar_of(tree, engine, str(index))
            proxies.append(Proxy(f"sidecar@{tree}", other, chat_targets(other.url, stream=stream)))
        asyncio.run(measure(proxies, rounds=args.rounds, pairs=args.pairs, warmup=args.warmup))
        if args.clients:
            asyncio.run(
                measure_load(
                    proxies, clients_=args.clients, bursts=args.bursts, calls=args.burst_calls
                )
            )
        return {p.name: p.result() for p in proxies}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=80, help="rounds of every proxy (default %(default)s)"
    )
    parser.add_argument(
        "--pairs", type=int, default=3, help="call pairs per proxy per round (default %(default)s)"
    )
    parser.add_argument("--warmup", type=int, default=20, help="calls per proxy before measuring")
    parser.add_argument("--json", action="store_true", help="sidecar calls without streaming")
    parser.add_argument(
        "--compare", type=Path, action="append", default=[], help="another checkout's sidecar too"
    )
    parser.add_argument(
        "--clients", type=int, default=0, help="concurrent clients of a load phase (0: none)"
    )
    parser.add_argument("--bursts", type=int, default=6, help="load bursts per proxy")
    parser.add_argument("--burst-calls", type=int, default=300, help="calls per load burst")
    parser.add_argument("--quick", action="store_true", help="a smoke run (4 rounds of 1 pair)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.pairs, args.warmup = 4, 1, 2
        args.bursts, args.burst_calls = 1, 2 * args.clients
    with tempfile.TemporaryDirectory(prefix="openforge-cpu-") as tmp:
        found = run(args, Path(tmp))
    print(
        f"{'proxy':<28} {'cpu ms/call':>11} {'lat p50':>8} {'lat p99':>8} {'ttft p50':>8} "
        f"{'peak MB':>8}"
    )
    for name, row in found.items():
        ttft = f"{row['text_ttft_ms']['p50']:8.2f}" if row["text_ttft_ms"] else f"{'-':>8}"
        print(
            f"{name:<28} {row['cpu_ms_per_call']:11.3f} {row['text_latency_ms']['p50']:8.2f}"
            f" {row['text_latency_ms']['p99']:8.2f} {ttft} {row['peak_rss_mb']:8.1f}"
        )
    if args.clients:
        print(f"\nunder {args.clients} concurrent clients:")
        print(f"{'proxy':<28} {'cpu ms/call':>11} {'calls/s':>8} {'peak MB':>8}")
        for name, row in found.items():
            load = row["load"]
            print(
                f"{name:<28} {load['cpu_ms_per_call']:11.3f} {load['calls_per_s']:8.1f}"
                f" {load['peak_rss_mb']:8.1f}"
            )
    print("--- json ---")
    print(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
