"""The gateway between mitmproxy and the engine, alone: what it relays, and what it
says when the engine cannot be reached, hangs, or breaks off.

Real sockets on 127.0.0.1: a raw client stands in for mitmproxy, and engines
are small asyncio servers that misbehave on purpose; one whose accept queue is
full stands in for an address that never answers a connect.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable

import pytest
from openforge_sidecar import gateway

FAST = gateway.Timeouts(connect=1.0, first_byte=1.0, idle=1.0)
Engine = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def exchange(engine_url: str, *, timeouts: gateway.Timeouts = FAST) -> bytes:
    """What mitmproxy would read from the gateway for one request to ``engine_url``."""
    gate = gateway.Gateway(timeouts)
    await gate.start()
    try:
        path = gate.submit(
            gateway.EngineRequest(
                url=engine_url + "/v1/completions",
                headers=((b"content-type", b"application/json"),),
                body=b'{"prompt": [1, 2]}',
            )
        )
        reader, writer = await asyncio.open_connection("127.0.0.1", gate.port)
        writer.write(b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n" % path.encode())
        answer = await asyncio.wait_for(reader.read(-1), 10)
        writer.close()
        assert gate.pending == 0
        return answer
    finally:
        await gate.close()


async def with_engine(engine: Engine) -> bytes:
    server = await asyncio.start_server(engine, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        return await exchange(f"http://127.0.0.1:{port}")
    finally:
        server.close()


def split(answer: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return head + await reader.readexactly(length)


def test_an_answer_is_relayed_as_it_comes_without_hop_by_hop_headers() -> None:
    seen: list[bytes] = []

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-openforge-policy-version: 3\r\n"
            b"transfer-encoding: chunked\r\nkeep-alive: timeout=5\r\n\r\n"
            b"8\r\ndata: a\n\r\n8\r\ndata: b\n\r\n0\r\n\r\n"
        )
        await writer.drain()
        await asyncio.sleep(0.5)  # the end came by the chunked framing, not by the close

    status, headers, body = split(asyncio.run(with_engine(engine)))
    assert (status, body) == (200, b"data: a\ndata: b\n")
    assert headers["x-openforge-policy-version"] == "3" and headers["connection"] == "close"
    assert "transfer-encoding" not in headers and "keep-alive" not in headers
    [request] = seen
    assert request.startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert b"content-type: application/json" in request and request.endswith(b'{"prompt": [1, 2]}')


def test_an_engine_that_never_answers_is_a_504_naming_the_wait() -> None:
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    status, headers, body = split(asyncio.run(with_engine(engine)))
    assert (status, headers[gateway.FAILURE_HEADER]) == (504, "timeout")
    assert "sent no response head for 1 s" in json.loads(body)["error"]["message"]


@pytest.mark.parametrize(
    ("after_head", "said"),
    [
        (b"8\r\ndata: a\n\r\n", "sent nothing more for 1 s"),  # then silence
        (b"8\r\ndata: a\n\r\n" + b"CLOSE", "broke off its answer"),  # then the connection closes
    ],
)
def test_an_answer_that_stops_or_breaks_off_ends_with_an_error_event(
    after_head: bytes, said: str
) -> None:
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        writer.write(after_head.removesuffix(b"CLOSE"))
        await writer.drain()
        if after_head.endswith(b"CLOSE"):
            writer.close()
            return
        await asyncio.sleep(5)

    status, _, body = split(asyncio.run(with_engine(engine)))
    assert status == 200  # the head was relayed before the failure
    assert body.startswith(b"data: a\n")
    event = body.split(b"data: ")[-1]
    assert said in json.loads(event)["error"]["message"]


def test_an_engine_closing_before_a_head_is_a_502() -> None:
    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.close()

    status, headers, body = split(asyncio.run(with_engine(engine)))
    assert (status, headers[gateway.FAILURE_HEADER]) == (502, "unreachable")
    assert "the engine at 127.0.0.1" in json.loads(body)["error"]["message"]


def test_a_refused_connection_is_a_502_naming_the_engine() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    status, headers, body = split(asyncio.run(exchange(f"http://127.0.0.1:{port}")))
    assert (status, headers[gateway.FAILURE_HEADER]) == (502, "unreachable")
    assert (
        f"the engine at http://127.0.0.1:{port}: cannot connect"
        in json.loads(body)["error"]["message"]
    )


def test_a_connect_that_never_completes_is_a_504() -> None:
    """A listening socket whose accept queue is full drops further SYNs: the connect hangs."""
    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        port = full.getsockname()[1]
        fillers = []
        for _ in range(4):  # enough to fill the queue on any kernel's rounding of backlog 0
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        try:
            status, headers, body = split(asyncio.run(exchange(f"http://127.0.0.1:{port}")))
        finally:
            for filler in fillers:
                filler.close()
    assert (status, headers[gateway.FAILURE_HEADER]) == (504, "timeout")
    assert "no connection within 1 s" in json.loads(body)["error"]["message"]


def test_a_path_nobody_submitted_is_refused_and_a_withdrawn_one_is_forgotten() -> None:
    async def run() -> tuple[bytes, int]:
        gate = gateway.Gateway(FAST)
        await gate.start()
        path = gate.submit(gateway.EngineRequest(url="http://127.0.0.1:9/x", headers=(), body=b""))
        gate.withdraw(path)
        reader, writer = await asyncio.open_connection("127.0.0.1", gate.port)
        writer.write(b"POST %s HTTP/1.1\r\n\r\n" % path.encode())
        answer = await asyncio.wait_for(reader.read(-1), 10)
        await gate.close()
        return answer, gate.pending

    answer, pending = asyncio.run(run())
    assert split(answer)[0] == 404 and pending == 0


def test_timeouts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="engine first byte timeout must be > 0 seconds"):
        gateway.Timeouts(connect=1, first_byte=0, idle=1)
