"""Generated tokens per second: ``openforge serve`` against plain ``model.generate``.

One run, one model (a Qwen2 built from a seed, saved with the tiny tokenizer),
the same requests three ways:

* ``serve``: ``openforge serve`` in its own process (``--threads`` as given),
  C concurrent streaming clients, each sending its share of the requests one
  after another, with the body the sidecar sends (token-ID prompt,
  ``logprobs: 1``, ``return_token_ids``, usage);
* ``generate_seq``: ``model.generate`` in this process, one request at a time;
* ``generate_batch``: ``model.generate`` on left-padded batches of C requests
  (for C > 1), which is what static batching gets.

All greedy, same ``max_tokens``, same thread count; a request stops at EOS in
every path, and only tokens actually generated count (not a batch's padding).
As a check that the paths do the same work, the server's token IDs are
compared with ``generate``'s for every request. Prints a table, then
``--- json ---`` and a JSON summary.

    python bench/serve_throughput.py            # full run, a few minutes
    python bench/serve_throughput.py --quick    # smoke run, seconds
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch
from transformers import PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "trainer" / "openforge_trainer" / "assets" / "tiny-tokenizer"
EOS_ID = 2  # <|im_end|> in the tiny tokenizer, the server's EOS
LEVELS = (1, 8, 32)


@dataclass(frozen=True, slots=True)
class Settings:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    max_tokens: int
    rounds: int  # requests per client at each level
    repeats: int  # measurements of each path at each level, interleaved
    prompt_lengths: tuple[int, int]


def settings(quick: bool) -> Settings:
    if quick:
        return Settings(64, 2, 4, 2, 128, max_tokens=8, rounds=1, repeats=1, prompt_lengths=(8, 24))
    return Settings(256, 4, 8, 4, 768, max_tokens=64, rounds=2, repeats=3, prompt_lengths=(32, 128))


def build_model(directory: Path, s: Settings) -> Path:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=4096,
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        initializer_range=0.1,
    )
    Qwen2ForCausalLM(config).save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER / name, directory / name)
    return directory


def prompts(count: int, s: Settings, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    low, high = s.prompt_lengths
    return [[rng.randrange(10, 4096) for _ in range(rng.randint(low, high))] for _ in range(count)]


# --- the server path --------------------------------------------------------------


def start_server(model_dir: Path, threads: int) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "openforge_trainer.serving.server", "--model", str(model_dir),
         "--port", "0", "--threads", str(threads), "--max-batch", str(max(LEVELS)),
         "--model-name", "bench"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("openforge serve: serving"):
        process.kill()
        raise RuntimeError(f"openforge serve did not start: {line!r}")
    # "openforge serve: serving NAME on URL (torch threads: N)"
    return process, line.split(" on ", 1)[1].split()[0]


async def one_request(
    client: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int
) -> tuple[list[int], float, float]:
    """Stream one completion; its token IDs, time to first token and total time (s)."""
    body = {
        "model": "bench",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": 1,
        "return_token_ids": True,
    }
    start = time.perf_counter()
    first = 0.0
    ids: list[int] = []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(
                f"server answered {response.status_code}: {await response.aread()!r}"
            )
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk["choices"]:
                if not ids:
                    first = time.perf_counter() - start
                ids.extend(choice["token_ids"])
    return ids, first, time.perf_counter() - start


async def serve_level(
    url: str, work: list[list[int]], concurrency: int, max_tokens: int
) -> tuple[dict[str, Any], list[list[int]]]:
    outputs: list[list[int]] = [[] for _ in work]
    ttfts: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def worker(offset: int) -> None:
            for index in range(offset, len(work), concurrency):
                ids, ttft, _ = await one_request(client, url, work[index], max_tokens)
                outputs[index] = ids
                ttfts.append(ttft)

        start = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - start
    tokens = sum(len(ids) for ids in outputs)
    ttfts.sort()
    figures = {
        "requests": len(work),
        "tokens": tokens,
        "seconds": round(elapsed, 3),
        "tokens_per_s": round(tokens / elapsed, 1),
        "ttft_p50_ms": round(1000 * ttfts[len(ttfts) // 2], 2),
    }
    return figures, outputs


# --- the generate paths ---------------------------------------------------------


def generated(row: list[int]) -> list[int]:
    """A generate() row's new tokens up to and including EOS (the rest is padding)."""
    return row[: row.index(EOS_ID) + 1] if EOS_ID in row else row


def generate_level(
    model: PreTrainedModel, work: list[list[int]], batch: int, max_tokens: int
) -> tuple[dict[str, Any], list[list[int]]]:
    outputs: list[list[int]] = []
    start = time.perf_counter()
    with torch.inference_mode():
        for first in range(0, len(work), batch):
            group = work[first : first + batch]
            width = max(len(p) for p in group)
            ids = torch.tensor([[EOS_ID] * (width - len(p)) + p for p in group])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_tokens,
                do_sample=False,
                eos_token_id=EOS_ID,
                pad_token_id=EOS_ID,
            )
            outputs.extend(generated(row) for row in out[:, width:].tolist())
    elapsed = time.perf_counter() - start
    tokens = sum(len(ids) for ids in outputs)
    figures = {
        "requests": len(work),
        "tokens": tokens,
        "seconds": round(elapsed, 3),
        "tokens_per_s": round(tokens / elapsed, 1),
    }
    return figures, outputs


# --- the run --------------------------------------------------------------------


def run(quick: bool, threads: int) -> dict[str, Any]:
    s = settings(quick)
    torch.set_num_threads(threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="openforge-serve-bench-") as tmp:
        model_dir = build_model(Path(tmp) / "model", s)
        model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model.eval()
        parameters = sum(p.numel() for p in model.parameters())
        process, url = start_server(model_dir, threads)
        try:
            warmup = prompts(2, s, seed=99)
            asyncio.run(serve_level(url, warmup, 2, s.max_tokens))
            generate_level(model, warmup, 1, s.max_tokens)
            levels = [measure(c, s, url, model) for c in LEVELS]
        finally:
            process.terminate()
            process.wait(timeout=60)
    return {
        "quick": quick,
        "model": {"parameters": parameters, "hidden": s.hidden, "layers": s.layers, "vocab": 4096},
        "max_tokens": s.max_tokens,
        "prompt_lengths": list(s.prompt_lengths),
        "repeats": s.repeats,
        "threads": threads,
        "machine": {
            "cpus": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "levels": levels,
    }


def measure(concurrency: int, s: Settings, url: str, model: PreTrainedModel) -> dict[str, Any]:
    """Every path on the same requests, ``repeats`` times, the order rotated each time.

    Load from elsewhere on a shared machine then hits every path alike; the
    figures reported are the medians, with every sample kept in the JSON.
    """
    work = prompts(concurrency * s.rounds, s, seed=concurrency)
    paths = ["serve", "generate_seq"] + (["generate_batch"] if concurrency > 1 else [])
    samples: dict[str, list[dict[str, Any]]] = {path: [] for path in paths}
    outputs: dict[str, list[list[int]]] = {}
    for repeat in range(s.repeats):
        for path in paths[repeat % len(paths) :] + paths[: repeat % len(paths)]:
            if path == "serve":
                figures, ids = asyncio.run(serve_level(url, work, concurrency, s.max_tokens))
            else:
                batch = concurrency if path == "generate_batch" else 1
                figures, ids = generate_level(model, work, batch, s.max_tokens)
            samples[path].append(figures)
            outputs.setdefault(path, ids)
    row: dict[str, Any] = {"concurrency": concurrency, "requests": len(work)}
    for path in paths:
        rates = sorted(f["tokens_per_s"] for f in samples[path])
        row[path] = {"tokens_per_s": rates[len(rates) // 2], "samples": samples[path]}
    ttfts = sorted(f["ttft_p50_ms"] for f in samples["serve"])
    row["serve"]["ttft_p50_ms"] = ttfts[len(ttfts) // 2]
    row["same_tokens_as_generate"] = sum(
        a == b for a, b in zip(outputs["serve"], outputs["generate_seq"], strict=True)
    )
    return row


def table(summary: dict[str, Any]) -> str:
    model = summary["model"]
    lines = [
        f"model: Qwen2 {model['parameters'] / 1e6:.1f}M parameters ({model['layers']} layers, "
        f"hidden {model['hidden']}), float32 CPU, {summary['threads']} torch threads; "
        f"greedy, max_tokens {summary['max_tokens']}, prompts of "
        f"{summary['prompt_lengths'][0]}-{summary['prompt_lengths'][1]} tokens",
        f"generated tokens/s, median of {summary['repeats']} interleaved runs",
        f"{'clients':>7} {'requests':>8} {'serve':>9} {'gen seq':>9} {'gen batch':>9} "
        f"{'serve/seq':>9} {'serve/batch':>11} {'ttft p50 ms':>11} {'same tokens':>11}",
    ]
    for row in summary["levels"]:
        serve = row["serve"]["tokens_per_s"]
        seq = row["generate_seq"]["tokens_per_s"]
        batch = row.get("generate_batch", {}).get("tokens_per_s")
        lines.append(
            f"{row['concurrency']:>7} {row['requests']:>8} {serve:>9.1f} {seq:>9.1f} "
            f"{batch if batch is not None else '-':>9} {serve / seq:>9.2f} "
            f"{f'{serve / batch:.2f}' if batch else '-':>11} {row['serve']['ttft_p50_ms']:>11.2f} "
            f"{row['same_tokens_as_generate']:>5}/{row['requests']:<5}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny model, few tokens")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads for every path (default 1)"
    )
    args = parser.parse_args()
    summary = run(args.quick, args.threads)
    print(table(summary))
    print("--- json ---")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
