"""Calls to the test engine's HTTP endpoints, shared by its tests: one answer, or one stream's
chunks."""

from __future__ import annotations

import json
from typing import Any

import httpx


def answer(url: str, path: str, **body: Any) -> dict[str, Any]:
    """POST ``body`` (model "tiny" unless given) to ``path``; the 200 answer's JSON."""
    response = httpx.post(f"{url}{path}", json={"model": "tiny", **body}, timeout=10)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def stream(url: str, path: str, **body: Any) -> list[dict[str, Any]]:
    """The same, streamed: every SSE chunk before the closing ``[DONE]``, parsed."""
    chunks: list[dict[str, Any]] = []
    payload = {"model": "tiny", "stream": True, **body}
    with httpx.stream("POST", f"{url}{path}", json=payload, timeout=10) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [e for e in response.read().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    for event in events[:-1]:
        assert event.startswith("data: ")
        chunks.append(json.loads(event[len("data: ") :]))
    return chunks
