"""A spooled call lets go of its bulk (mitmproxy's flows outlive their calls); an answered call is
spooled after its answer's end.

The record has everything; what the flow still refers to (the call in its
metadata, the relay through the stream callable) is freed at once instead of
when the cyclic collector reaches the flow.
"""

from __future__ import annotations

import gc
import types
import weakref
from typing import Any

from openforge.wire import codecs, conversation
from openforge_sidecar import capture


class _FakeRelay:
    def __init__(self) -> None:
        self.seen: list[bytes] = []

    def __call__(self, data: bytes) -> bytes:
        self.seen.append(data)
        return data.upper()


def _call() -> capture._Call:
    codec = codecs.for_path("/v1/chat/completions")
    assert codec is not None
    return capture._Call(
        index=0,
        codec=codec,
        request=conversation.ChatRequest(api=codec.api, model="m", messages=()),
        request_json=b"{" + b" " * 20_000 + b"}",
        headers={"user-agent": "x"},
        received_ns=0,
        started=0.0,
    )


def test_a_released_call_holds_no_body_relay_or_tee_and_its_stream_relays_nothing() -> None:
    call = _call()
    fake: Any = _FakeRelay()
    call.relay = fake
    stream = capture._guarded(call)
    assert stream(b"abc") == [b"ABC"] and fake.seen == [b"abc"]
    gone = weakref.ref(fake)
    del fake
    gc.disable()  # freed by reference counting, not by a collection
    try:
        capture._release(call)
        assert gone() is None
    finally:
        gc.enable()
    assert (call.request_json, call.headers, call.plan, call.relay, call.tee) == (
        b"",
        {},
        None,
        None,
        None,
    )
    assert stream(b"late") == []  # a chunk after the call was spooled is not relayed


def test_the_tee_stream_passes_bytes_through_before_and_after_release() -> None:
    call = _call()
    seen: list[bytes] = []

    class _Tee:
        def __call__(self, data: bytes) -> bytes:
            seen.append(data)
            return data

    call.tee = _Tee()  # type: ignore[assignment]
    stream = capture._teeing(call)
    assert stream(b"one") == b"one" and seen == [b"one"]
    capture._release(call)
    assert stream(b"two") == b"two" and seen == [b"one"]


def test_a_call_answered_is_spooled_in_the_loops_next_round_and_one_not_spooled_is_reported_lost(
) -> None:  # fmt: skip
    import asyncio

    addon = capture.Capture()
    spooled: list[tuple[int, int, str]] = []

    def spool_call(
        call: capture._Call, *, status: int, error: str, response_json: bytes | None = None
    ) -> None:
        if error == "boom":
            raise RuntimeError("spool failed")
        spooled.append((call.index, status, error))

    addon._spool_call = spool_call  # type: ignore[method-assign]
    lost: list[tuple[str, bool, int]] = []

    def lose(reason: str, *, whole: bool, call_index: int = 0) -> None:
        lost.append((reason, whole, call_index))

    addon._recorder = types.SimpleNamespace(lose=lose)  # type: ignore[assignment]

    async def scenario() -> None:
        first, second = _call(), _call()
        second.index = 1
        addon._spool_after_answer(first, status=200, error="")
        addon._spool_after_answer(second, status=200, error="boom")
        assert first.finished and second.finished and spooled == []  # the hook returns first
        await asyncio.sleep(0)
        assert spooled == [(0, 200, "")]

    asyncio.run(scenario())
    assert addon.stats["spool_failed"] == 1
    # A call whose record could not be made is reported lost, with why: never silently.
    assert lost == [("recording call 1 failed: RuntimeError('spool failed')", False, 1)]
