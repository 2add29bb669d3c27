"""The sidecar's client of the engine, with timeouts of its own.

mitmproxy can send a call upstream, but not let an addon answer the harness
as an upstream fails: an engine that cannot be reached or resets gave the
harness mitmproxy's HTML 502 page, and one that hangs kept the harness waiting
for mitmproxy's ten-minute inactivity timeout. An addon cannot stream an
answer of its own either. So in tokens mode mitmproxy's upstream is this
gateway, a server on 127.0.0.1 in the sidecar's own event loop: the addon
hands it the engine request (:meth:`Gateway.submit`) and points the flow at
the path it returns; the gateway sends the request to the engine and relays
the engine's answer as it comes, read to the end of the connection. Where
the engine fails, the gateway's answer says so in a form the relay already
turns into the harness's API error:

* no connection within ``connect`` seconds, refused, or closed before a
  response head: 502 (504 for the timeout), ``{"error": {"message": ...}}``
  and the header :data:`FAILURE_HEADER`;
* no response head within ``first_byte`` seconds of the request: 504, the same;
* a body that stops for ``idle`` seconds, or a connection cut before the body
  ended: an SSE ``data: {"error": ...}`` event, then the end of the answer.

What it costs: one connection on 127.0.0.1 per call and a copy of each chunk
in this process (``bench/proxy_overhead.py`` measures it with the rest).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import ssl
import urllib.parse
from dataclasses import dataclass

import h11

log = logging.getLogger(__name__)

FAILURE_HEADER = "x-openforge-gateway-failure"
"""Set on the gateway's own answer when the engine failed: ``timeout`` or ``unreachable``."""
PATH_PREFIX = "/openforge-gateway/"
_READ = 65536
_HEAD_LIMIT = 65536
_HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"te", b"trailer"}
)


@dataclass(frozen=True)
class Timeouts:
    """Seconds the gateway waits on the engine (each must be positive)."""

    connect: float
    first_byte: float
    idle: float

    def __post_init__(self) -> None:
        for name in ("connect", "first_byte", "idle"):
            if not getattr(self, name) > 0:
                raise ValueError(f"engine {name.replace('_', ' ')} timeout must be > 0 seconds")


@dataclass(frozen=True)
class EngineRequest:
    """A POST to the engine: its URL, headers (without Host) and body."""

    url: str
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


class EngineFailure(Exception):
    """The engine failed before its response head: ``kind`` is timeout or unreachable."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Gateway:
    """Relays engine requests handed in by the addon (see the module docstring)."""

    def __init__(self, timeouts: Timeouts) -> None:
        self.timeouts = timeouts
        self.port = 0
        self._pending: dict[str, EngineRequest] = {}
        self._ids = itertools.count(1)
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def submit(self, request: EngineRequest) -> str:
        """Keep ``request`` for the next connection that asks for the path returned."""
        path = f"{PATH_PREFIX}{next(self._ids)}"
        self._pending[path] = request
        return path

    def withdraw(self, path: str) -> None:
        """Forget a submitted request nobody came for (its flow failed first)."""
        self._pending.pop(path, None)

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            path = await _request_path(reader)
            request = self._pending.pop(path, None) if path else None
            if request is None:
                writer.write(_failure_head(404, "unreachable", f"no engine request at {path!r}"))
                return
            await self._relay(request, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # mitmproxy went away: the flow's error hook records the call
        finally:
            with contextlib.suppress(ConnectionError, OSError):
                await writer.drain()
            writer.close()

    async def _relay(self, request: EngineRequest, out: asyncio.StreamWriter) -> None:
        try:
            engine, conn = await self._open(request)
        except EngineFailure as failure:
            out.write(
                _failure_head(504 if failure.kind == "timeout" else 502, failure.kind, str(failure))
            )
            return
        reader, writer = engine
        try:
            await self._answer(request, reader, conn, out)
        finally:
            writer.close()

    async def _open(
        self, request: EngineRequest
    ) -> tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter], h11.Connection]:
        url = urllib.parse.urlsplit(request.url)
        host = url.hostname or "127.0.0.1"
        port = url.port or (443 if url.scheme == "https" else 80)
        where = f"the engine at {url.scheme}://{url.netloc}"
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(
                    host, port, ssl=ssl.create_default_context() if url.scheme == "https" else None
                ),
                self.timeouts.connect,
            )
        except TimeoutError:
            raise EngineFailure(
                "timeout", f"{where}: no connection within {self.timeouts.connect:g} s"
            ) from None
        except OSError as exc:
            raise EngineFailure("unreachable", f"{where}: cannot connect: {exc}") from None
        conn = h11.Connection(our_role=h11.CLIENT)
        target = (url.path or "/") + (f"?{url.query}" if url.query else "")
        headers = [(b"host", url.netloc.encode()), *request.headers]
        headers.append((b"content-length", str(len(request.body)).encode()))
        headers.append((b"connection", b"close"))
        for event in (
            h11.Request(method="POST", target=target, headers=headers),
            h11.Data(data=request.body),
            h11.EndOfMessage(),
        ):
            for data in conn.send_with_data_passthrough(event) or ():  # the body: not copied
                writer.write(data)
        return (reader, writer), conn

    async def _answer(
        self,
        request: EngineRequest,
        reader: asyncio.StreamReader,
        conn: h11.Connection,
        out: asyncio.StreamWriter,
    ) -> None:
        where = f"the engine at {urllib.parse.urlsplit(request.url).netloc}"
        started = False  # the response head is relayed: failures are events from here on

        def fail(message: str, *, status: int = 502, kind: str = "unreachable") -> None:
            out.write(_failure_event(message) if started else _failure_head(status, kind, message))

        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                fail(f"{where} broke off its answer: {exc}")
                return
            if event is h11.NEED_DATA:
                wait = self.timeouts.idle if started else self.timeouts.first_byte
                try:
                    data = await asyncio.wait_for(reader.read(_READ), wait)
                except TimeoutError:
                    what = "sent nothing more" if started else "sent no response head"
                    fail(f"{where} {what} for {wait:g} s", status=504, kind="timeout")
                    return
                except OSError as exc:
                    fail(f"{where} broke off its answer: {exc}")
                    return
                conn.receive_data(data)  # b"": the engine closed; h11 says if that was the end
            elif isinstance(event, h11.Response):
                started = True
                out.write(_head(event))
            elif isinstance(event, h11.Data):
                out.write(bytes(event.data))
                await out.drain()
            elif isinstance(event, h11.EndOfMessage):
                return
            elif isinstance(event, h11.ConnectionClosed):
                fail(f"{where} closed the connection before its answer ended")
                return


async def _request_path(reader: asyncio.StreamReader) -> str | None:
    """The path of mitmproxy's request (a head with no body: the body is kept here)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        return None
    if len(head) > _HEAD_LIMIT:
        return None
    parts = head.split(b"\r\n", 1)[0].split(b" ")
    return parts[1].decode("ascii", "replace") if len(parts) == 3 else None


def _head(response: h11.Response) -> bytes:
    """The engine's response head, framed for a body that ends with the connection."""
    lines = [b"HTTP/1.1 %d %s" % (response.status_code, response.reason or b"-")]
    lines += [name + b": " + value for name, value in response.headers if name not in _HOP_BY_HOP]
    lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _failure_head(status: int, kind: str, message: str) -> bytes:
    log.warning("engine call failed: %s", message)
    body = json.dumps({"error": {"message": message, "type": f"engine_{kind}"}}).encode()
    return (
        b"HTTP/1.1 %d -\r\ncontent-type: application/json\r\n%s: %s\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n"
        % (status, FAILURE_HEADER.encode(), kind.encode(), len(body))
    ) + body


def _failure_event(message: str) -> bytes:
    log.warning("engine call failed mid-answer: %s", message)
    error = {"error": {"message": message, "type": "engine_failed_midway"}}
    return b"\n\ndata: " + json.dumps(error).encode() + b"\n\n"
