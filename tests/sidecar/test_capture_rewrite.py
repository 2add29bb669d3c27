"""A call the sidecar fails to rewrite for the engine is answered with the API's error and
recorded, never sent on as it came (mitmproxy forwards a request whose hook raised)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import local_http
import pytest
import tiny_policy
from mitmproxy.test import taddons, tflow, tutils
from openforge_sidecar import capture, memory
from openforge_sidecar.policy import engine as engine_module
from openforge_sidecar.recording import spool


@pytest.fixture
def engine() -> Iterator[str]:
    with local_http.serving(local_http.models("policy-x")) as url:
        yield url


@contextlib.asynccontextmanager
async def requested(engine: str, tmp_path: Path, body: bytes) -> AsyncIterator[Any]:
    """A running capture addon's ``request`` hook given a Chat Completions call of
    ``body``: (the addon, the flow); the addon is done when the block ends."""
    addon = capture.Capture()
    with taddons.context(addon) as tctx:
        tctx.configure(
            addon,
            openforge_engine=engine,
            openforge_tokenizer=str(tiny_policy.DIR),
            openforge_spool=str(tmp_path / "spool"),
        )
        await addon.running()
        flow = tflow.tflow(
            req=tutils.treq(
                method=b"POST", path=b"/v1/chat/completions", content=body,
                headers=((b"content-type", b"application/json"),),
            )
        )  # fmt: skip
        await addon.request(flow)
        yield addon, flow
        await addon.done()


@pytest.mark.parametrize("size", [100, 2 * 1024 * 1024])  # kept in memory, and stashed
def test_a_request_the_sidecar_cannot_rewrite_is_refused_and_recorded(
    engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    def broken(**_: object) -> bytes:
        raise RuntimeError("no body today")

    monkeypatch.setattr(engine_module, "completion_body", broken)
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x" * size}]}
    ).encode()

    async def main() -> None:
        async with requested(engine, tmp_path, body) as (addon, flow):
            assert flow.response is not None and flow.response.status_code == 500
            error = json.loads(flow.response.content or b"")["error"]
            assert (
                "could not rewrite it" in error["message"] and "no body today" in error["message"]
            )
            assert addon.stats["rewrite_failed"] == 1

    asyncio.run(main())
    calls = [r.call for r in spool.Spool(tmp_path / "spool").records_after(0) if r.HasField("call")]
    assert len(calls) == 1 and calls[0].http_status == 500 and "no body today" in calls[0].error
    assert calls[0].request_json == body
    assert not list((tmp_path / "spool" / "stash").glob("*.*"))


@pytest.mark.parametrize("size", [100, 512 * 1024, 2 * 1024 * 1024])
def test_a_large_calls_engine_request_is_sent_as_a_view_of_its_body(
    engine: str, tmp_path: Path, size: int
) -> None:
    """asyncio (3.11) slices off what the socket does not take at once, then copies it
    into its buffer: a large body sent as bytes was three copies at that moment, as a
    view two. A small body stays bytes (nothing to gain, and mitmproxy's own code
    expects bytes)."""
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "x " * size}]}
    ).encode()

    async def main() -> None:
        async with requested(engine, tmp_path, body) as (_, flow):
            assert flow.response is None  # sent on to the engine
            sent = flow.request.raw_content
            assert isinstance(sent, memoryview if len(body) > memory.LARGE_BYTES else bytes)
            assert flow.request.headers["content-length"] == str(len(sent))
            prompt = json.loads(bytes(sent))["prompt"]
            assert len(prompt) > size // 2  # the prompt's IDs, all of them

    asyncio.run(main())
