"""Timed model calls over HTTP, one at a time or from many concurrent clients.

A :class:`Target` is one request a path serves (URL, body, whether it
streams, which wire format comes back). :func:`timed_call` sends it and
returns the latency and, for streams, the time to first token: the time
until the first SSE event that carries content (generated text, or a tool
call), as a client sees it. Every answer is checked (HTTP 200, content
present, a stream ended by ``[DONE]``); a bad one raises :class:`CallFailed`
so a broken path can never pass for a fast one.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from openforge.wire import sse


class CallFailed(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class Target:
    url: str
    body: bytes
    streamed: bool
    wire: str  # "completions" (engine dialect) or "chat" (OpenAI Chat Completions)


@dataclass(frozen=True, slots=True)
class Sample:
    latency_s: float
    ttft_s: float | None


def client(connections: int) -> httpx.AsyncClient:
    """A keep-alive client that ignores proxy settings from the environment."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(60.0), trust_env=False)


def has_content(data: str, wire: str) -> bool:
    """Whether one SSE ``data`` payload carries generated content."""
    if data.strip() == "[DONE]":
        return False
    body: Any = json.loads(data)
    choices = body.get("choices") or [] if isinstance(body, dict) else []
    if not choices:
        return False
    if wire == "completions":
        return bool(choices[0].get("text") or choices[0].get("token_ids"))
    delta = choices[0].get("delta") or {}
    return bool(delta.get("content") or delta.get("tool_calls"))


def _check_body(body: bytes, wire: str, url: str) -> None:
    parsed: Any = json.loads(body)
    choice = (parsed.get("choices") or [{}])[0] if isinstance(parsed, dict) else {}
    message = choice.get("message") or {}
    if not (message.get("content") or message.get("tool_calls")):
        raise CallFailed(f"{url}: answer has no content: {body[:200]!r}")


async def timed_call(http: httpx.AsyncClient, target: Target) -> Sample:
    headers = {"content-type": "application/json", "authorization": "Bearer sk-bench"}
    start = time.perf_counter()
    ttft: float | None = None
    async with http.stream("POST", target.url, content=target.body, headers=headers) as response:
        if response.status_code != 200:
            detail = await response.aread()
            raise CallFailed(f"{target.url} answered {response.status_code}: {detail[:300]!r}")
        if not target.streamed:
            _check_body(await response.aread(), target.wire, target.url)
            return Sample(time.perf_counter() - start, None)
        parser = sse.SSEParser()
        tail = b""
        async for chunk in response.aiter_raw():
            if ttft is None and any(has_content(e.data, target.wire) for e in parser.feed(chunk)):
                ttft = time.perf_counter() - start
            tail = (tail + chunk)[-64:]
    latency = time.perf_counter() - start
    if ttft is None or b"[DONE]" not in tail:
        raise CallFailed(f"{target.url}: stream without content or without [DONE] (ends {tail!r})")
    return Sample(latency, ttft)


@dataclass(frozen=True, slots=True)
class Throughput:
    calls: int
    seconds: float

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.seconds if self.seconds > 0 else 0.0


async def concurrent_calls(
    http: httpx.AsyncClient,
    targets: Sequence[Target],
    *,
    clients: int,
    max_calls: int,
    max_seconds: float,
) -> Throughput:
    """``clients`` loops sharing one call budget, cycling through ``targets``.

    A client starts no new call once ``max_calls`` calls were started or
    ``max_seconds`` have passed, so the run is bounded both ways; calls
    per second counts completed calls over the time until the last one ends.
    """
    started = 0
    done = 0
    begin = time.perf_counter()
    deadline = begin + max_seconds

    async def loop() -> None:
        nonlocal started, done
        while started < max_calls and time.perf_counter() < deadline:
            target = targets[started % len(targets)]
            started += 1
            await timed_call(http, target)
            done += 1

    await asyncio.gather(*(loop() for _ in range(clients)))
    return Throughput(done, time.perf_counter() - begin)
