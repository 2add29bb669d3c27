"""What the OpenForge sidecar adds to a model call, against the engine and stock mitmproxy.

One run sends the same workload, a harness's OpenAI Chat Completions calls
(``bench/workload.py``), down each path, side by side, with the calls
interleaved so that load from elsewhere on the machine hits all paths alike:

* ``direct``: to the test engine's own ``/v1/chat/completions``, streamed:
  the engine renders the chat template, generates and parses tool calls, as
  vLLM does for a harness that talks to it without OpenForge;
* ``mitmdump``: the same requests through a stock ``mitmdump`` in reverse
  mode with a trivial tee addon (``bench/tee_addon.py``) in front of it;
* ``sidecar_stream`` / ``sidecar_json``: the same requests, streamed and
  not, through ``openforge sidecar`` (tokens mode, spool only), which
  renders them itself, asks the engine token-in/token-out
  (``/v1/completions``) and relays its tokens back in Chat form.

In the unpaced phase two diagnostic paths also run, to show the proxy hop
on its own: ``direct_tokens`` and ``mitmdump_tokens`` send the engine the
token-in/token-out request the sidecar would send (rendered outside the
measurement), straight and through stock mitmdump; their added figures are
over ``direct_tokens``. The targets are judged on the Chat paths.

Per engine pacing (``--token-delay-ms``; 0 ms isolates the proxies' own
cost, a few ms per token emulates generation), it reports latency p50/p99
per call and added over direct, time to first token (first content-bearing
SSE event at the client) p50/p99 on text answers, calls per second at 50
concurrent clients, and the proxies' peak RSS (VmHWM, sampled under load).
Prints a table, then ``--- json ---`` and a JSON summary.

    python bench/proxy_overhead.py            # full run, a few minutes
    python bench/proxy_overhead.py --quick    # smoke run, seconds
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import clients
import httpx
import servers
import workload
from openforge_sidecar.policy import template

PATHS = ("direct", "mitmdump", "sidecar_stream", "sidecar_json")
TOKEN_PATHS = ("direct_tokens", "mitmdump_tokens")  # diagnostics: the proxy hop on its own
STREAMED = ("direct", "mitmdump", "sidecar_stream")
#: The path each path's added figures are measured against.
BASELINE = {"direct_tokens": "direct_tokens", "mitmdump_tokens": "direct_tokens"}
TTFT_SCENARIO = "text"  # tool calls reach the client whole, at </tool_call>, by design
TTFT_TARGET_MS = 2.0
RSS_TARGET_MB = 100.0


@dataclass(frozen=True, slots=True)
class Phase:
    token_delay_ms: float
    samples: int
    paths: tuple[str, ...]
    scenarios: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Settings:
    phases: tuple[Phase, ...]
    warmup: int
    clients: int
    throughput_calls: int
    throughput_seconds: float


def settings(quick: bool, delay_ms: float) -> Settings:
    if quick:
        return Settings(
            phases=(Phase(0.0, 10, PATHS + TOKEN_PATHS, workload.SCENARIOS),
                    Phase(delay_ms, 6, STREAMED, (TTFT_SCENARIO,))),
            warmup=2, clients=50, throughput_calls=100, throughput_seconds=2.0,
        )  # fmt: skip
    return Settings(
        phases=(Phase(0.0, 300, PATHS + TOKEN_PATHS, workload.SCENARIOS),
                Phase(delay_ms, 200, STREAMED, (TTFT_SCENARIO,))),
        warmup=20, clients=50, throughput_calls=3000, throughput_seconds=10.0,
    )  # fmt: skip


# --- statistics -------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), ``q`` in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary_ms(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 50) * 1000, 3),
        "p99": round(percentile(values, 99) * 1000, 3),
    }


# --- memory ---------------------------------------------------------------------------


@dataclass
class MemorySampler:
    """Polls VmRSS/VmHWM of the proxies while load runs."""

    pids: dict[str, int]
    interval_s: float = 0.1
    peak_rss_kib: dict[str, int] = field(default_factory=dict)
    hwm_kib: dict[str, int] = field(default_factory=dict)

    def sample(self) -> None:
        for name, pid in self.pids.items():
            found = servers.memory_kib(pid)
            self.peak_rss_kib[name] = max(self.peak_rss_kib.get(name, 0), found["VmRSS"])
            self.hwm_kib[name] = found["VmHWM"]

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.interval_s)

    def result_mb(self) -> dict[str, dict[str, float]]:
        """Peak RSS: VmHWM, or the largest VmRSS sampled if the kernel's HWM lagged behind it."""
        return {
            name: {
                "peak_rss_mb": round(
                    max(self.hwm_kib[name], self.peak_rss_kib[name]) * 1024 / 1e6, 1
                ),
                "sampled_rss_mb": round(self.peak_rss_kib[name] * 1024 / 1e6, 1),
            }
            for name in self.pids
        }


@contextlib.asynccontextmanager
async def sampling(sampler: MemorySampler) -> Any:
    task = asyncio.create_task(sampler.run())
    try:
        yield sampler
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sampler.sample()


# --- one phase -------------------------------------------------------------------------


def targets(
    engine_url: str, model: str, urls: dict[str, str]
) -> dict[str, dict[str, clients.Target]]:
    """What each path is sent for each scenario."""
    tokenizer = template.PolicyTokenizer.load(engine_url)
    out: dict[str, dict[str, clients.Target]] = {path: {} for path in PATHS + TOKEN_PATHS}
    for scenario in workload.SCENARIOS:
        for path in ("direct", "mitmdump"):
            body = workload.chat_body(scenario, stream=True, model=model)
            out[path][scenario] = clients.Target(
                urls[path] + "/v1/chat/completions", body, True, "chat"
            )
        for path, stream in (("sidecar_stream", True), ("sidecar_json", False)):
            body = workload.chat_body(scenario, stream=stream)
            out[path][scenario] = clients.Target(
                urls[path] + "/v1/chat/completions", body, stream, "chat"
            )
        call = workload.engine_call(tokenizer, scenario, model=model)
        for path, via in (("direct_tokens", "direct"), ("mitmdump_tokens", "mitmdump")):
            out[path][scenario] = clients.Target(
                urls[via] + "/v1/completions", call.body, True, "completions"
            )
    return out


def rotations(paths: tuple[str, ...], rounds: int) -> Iterator[tuple[int, str]]:
    """(round, path) with the order of paths rotated every round, so none always goes first."""
    for index in range(rounds):
        shift = index % len(paths)
        for path in paths[shift:] + paths[:shift]:
            yield index, path


async def latency_samples(
    plan: dict[str, dict[str, clients.Target]], phase: Phase, warmup: int
) -> dict[str, dict[str, list[clients.Sample]]]:
    """One call at a time, each round sending every scenario down every path once."""
    found: dict[str, dict[str, list[clients.Sample]]] = {
        p: {s: [] for s in phase.scenarios} for p in phase.paths
    }
    async with clients.client(1) as http:
        for index, path in rotations(phase.paths, warmup + phase.samples):
            for scenario in phase.scenarios:
                sample = await clients.timed_call(http, plan[path][scenario])
                if index >= warmup:
                    found[path][scenario].append(sample)
    return found


async def throughput(
    plan: dict[str, dict[str, clients.Target]], settings_: Settings
) -> dict[str, float]:
    out: dict[str, float] = {}
    for path in STREAMED:
        cycle = [plan[path][s] for s in workload.SCENARIOS]
        async with clients.client(settings_.clients) as http:
            warm = max(settings_.clients, settings_.throughput_calls // 20)
            await clients.concurrent_calls(
                http,
                cycle,
                clients=settings_.clients,
                max_calls=warm,
                max_seconds=settings_.throughput_seconds,
            )
            result = await clients.concurrent_calls(
                http,
                cycle,
                clients=settings_.clients,
                max_calls=settings_.throughput_calls,
                max_seconds=settings_.throughput_seconds,
            )
        out[path] = round(result.calls_per_s, 1)
    return out


def latency_rows(
    samples: dict[str, dict[str, list[clients.Sample]]], phase: Phase
) -> list[dict[str, Any]]:
    rows = []
    for scenario in phase.scenarios:
        for path in phase.paths:
            direct = samples[BASELINE.get(path, "direct")][scenario]
            base = summary_ms([s.latency_s for s in direct])
            base_ttft = summary_ms([s.ttft_s for s in direct if s.ttft_s is not None])
            got = samples[path][scenario]
            latency = summary_ms([s.latency_s for s in got])
            row: dict[str, Any] = {
                "scenario": scenario,
                "path": path,
                "samples": len(got),
                "latency_ms": latency,
                "added_latency_ms": {k: round(latency[k] - base[k], 3) for k in latency},
            }
            ttfts = [s.ttft_s for s in got if s.ttft_s is not None]
            if scenario == TTFT_SCENARIO and ttfts:
                ttft = summary_ms(ttfts)
                row["ttft_ms"] = ttft
                row["added_ttft_ms"] = {k: round(ttft[k] - base_ttft[k], 3) for k in ttft}
            rows.append(row)
    return rows


async def run_phase(phase: Phase, settings_: Settings, workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    with servers.Servers(workdir) as procs:
        engine = procs.engine(token_delay_ms=phase.token_delay_ms)
        sidecar = procs.sidecar(engine)
        mitm = procs.mitmdump(engine)
        urls = {
            "direct": engine.url,
            "mitmdump": mitm.url,
            "sidecar_stream": sidecar.url,
            "sidecar_json": sidecar.url,
        }
        model = httpx.get(engine.url + "/v1/models", trust_env=False).json()["data"][0]["id"]
        plan = targets(engine.url, model, urls)
        sampler = MemorySampler({"sidecar": sidecar.process.pid, "mitmdump": mitm.process.pid})
        started = time.perf_counter()
        async with sampling(sampler):
            samples = await latency_samples(plan, phase, settings_.warmup)
            rates = await throughput(plan, settings_)
        stats = httpx.get(sidecar.url + "/openforge/v1/stats", trust_env=False).json()
        return {
            "token_delay_ms": phase.token_delay_ms,
            "prompt_tokens": {
                s: workload.engine_call(
                    template.PolicyTokenizer.load(engine.url), s, model=model
                ).prompt_tokens
                for s in workload.SCENARIOS
            },
            "latency": latency_rows(samples, phase),
            "throughput_calls_per_s": rates,
            "memory": sampler.result_mb(),
            "sidecar_counters": stats.get("counters", {}),
            "sidecar_merge_rate": stats.get("merge_rate"),
            "seconds": round(time.perf_counter() - started, 1),
        }


# --- targets and report -----------------------------------------------------------------


def _row(phase: dict[str, Any], scenario: str, path: str) -> dict[str, Any] | None:
    return next(
        (r for r in phase["latency"] if r["scenario"] == scenario and r["path"] == path), None
    )


def check_targets(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets, each with the figures it was judged on."""
    ttft: list[float] = []
    worse: list[str] = []
    rss: list[float] = []
    for phase in phases:
        tag = f"{phase['token_delay_ms']:g}ms"
        for row in phase["latency"]:
            stock = _row(phase, row["scenario"], "mitmdump")
            if not row["path"].startswith("sidecar") or stock is None:
                continue
            if "added_ttft_ms" in row:
                ttft.append(row["added_ttft_ms"]["p50"])
            for figure in ("latency_ms", "ttft_ms"):
                for q in ("p50", "p99"):
                    if figure in row and figure in stock and row[figure][q] > stock[figure][q]:
                        worse.append(
                            f"{tag} {row['scenario']} {row['path']} {figure} {q}: {row[figure][q]} "
                            f"> {stock[figure][q]}"
                        )
        rates = phase["throughput_calls_per_s"]
        if rates["sidecar_stream"] < rates["mitmdump"]:
            worse.append(
                f"{tag} throughput: {rates['sidecar_stream']} < {rates['mitmdump']} calls/s"
            )
        memory = phase["memory"]
        if memory["sidecar"]["peak_rss_mb"] > memory["mitmdump"]["peak_rss_mb"]:
            worse.append(
                f"{tag} peak RSS: {memory['sidecar']['peak_rss_mb']} > "
                f"{memory['mitmdump']['peak_rss_mb']} MB"
            )
        rss.append(memory["sidecar"]["peak_rss_mb"])
    return {
        "ttft_added_p50_le_2ms": {
            "met": bool(ttft) and max(ttft) <= TTFT_TARGET_MS,
            "worst_ms": max(ttft, default=None),
        },
        "no_worse_than_stock_mitmdump": {"met": not worse, "worse": worse},
        "sidecar_rss_le_100mb": {"met": max(rss) <= RSS_TARGET_MB, "peak_mb": max(rss)},
    }


def _pair(values: dict[str, float] | None) -> str:
    return f"{values['p50']:8.2f} {values['p99']:8.2f}" if values else f"{'-':>8} {'-':>8}"


def table(phase: dict[str, Any]) -> str:
    prompts = ", ".join(f"{k} {v}" for k, v in phase["prompt_tokens"].items())
    lines = [
        f"engine token delay {phase['token_delay_ms']:g} ms  (prompt tokens: {prompts}; "
        f"{phase['seconds']} s)",
        f"{'scenario':<10} {'path':<15} {'n':>4} {'lat p50':>8} {'lat p99':>8} {'+p50':>8} "
        f"{'+p99':>8} {'ttft p50':>8} {'ttft p99':>8} {'+p50':>8} {'+p99':>8}",
    ]
    for row in phase["latency"]:
        lines.append(
            f"{row['scenario']:<10} {row['path']:<15} {row['samples']:>4} "
            f"{_pair(row['latency_ms'])} {_pair(row['added_latency_ms'])} "
            f"{_pair(row.get('ttft_ms'))} {_pair(row.get('added_ttft_ms'))}"
        )
    lines.append("(+: over direct; the *_tokens rows over direct_tokens)")
    rates = phase["throughput_calls_per_s"]
    lines.append("calls/s at 50 clients: " + ", ".join(f"{k} {v}" for k, v in rates.items()))
    memory = phase["memory"]
    lines.append(
        "peak RSS (VmHWM): " + ", ".join(f"{k} {v['peak_rss_mb']} MB" for k, v in memory.items())
    )
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    import os

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


async def run(settings_: Settings, workdir: Path) -> dict[str, Any]:
    phases = []
    for index, phase in enumerate(settings_.phases):
        result = await run_phase(phase, settings_, workdir / f"phase{index}")
        print(table(result) + "\n", flush=True)
        phases.append(result)
    return {"machine": machine(), "phases": phases, "targets": check_targets(phases)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a short smoke run (few samples, short load)"
    )
    parser.add_argument(
        "--token-delay-ms",
        type=float,
        default=3.0,
        help="engine pacing of the paced phase (default %(default)s)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where logs and the spool go (default: a temporary directory)",
    )
    args = parser.parse_args(argv)
    chosen = settings(args.quick, args.token_delay_ms)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="openforge-bench-") as tmp:
        summary = asyncio.run(run(chosen, args.workdir or Path(tmp)))
    summary["seconds"] = round(time.perf_counter() - started, 1)
    summary["quick"] = args.quick
    for name, target in summary["targets"].items():
        print(
            f"target {name}: {'met' if target['met'] else 'MISSED'} "
            f"{json.dumps({k: v for k, v in target.items() if k != 'met'})}"
        )
    print("--- json ---")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
