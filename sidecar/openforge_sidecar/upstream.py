"""The engine's deadlines for a model call, and the harness's answer when the engine fails.

mitmproxy waits on an upstream until its ten-minute inactivity timeout, and
answers an upstream that cannot be reached or resets with its HTML 502 page,
or, once the answer began, by cutting the connection: nothing a harness's
SDK reads as its API's error. For the calls the sidecar sends to the engine:

* **Deadlines** (:class:`Deadline`). ``openforge_engine_connect_timeout``
  seconds to connect to the engine (a new connection; a kept-alive one has
  none to make), ``openforge_engine_first_byte_timeout`` seconds of silence
  before the engine's response head, ``openforge_engine_idle_timeout``
  seconds of silence after it. Past one, the engine connection is closed
  (:func:`close_server`), which mitmproxy turns into its error path, and
  :attr:`Deadline.expired` says which deadline passed.
* **The answer.** In that path (the capture's ``error`` hook), when the
  failure is the engine's (:func:`engine_failed`), the sidecar answers the
  harness itself (:func:`answer_client`): the API's error object (504 for a
  deadline, 502 otherwise) when no byte of the answer was sent, else the rest
  of the answer with the API's error event, in the response's framing
  (:func:`rest_of_stream`); then it closes the harness's connection, marked
  closed first, so mitmproxy writes nothing after it.

Silence is the time since the last event on the harness's connection handler,
read from mitmproxy's own clock for it (``timeout_watchdog.last_activity``):
while a call waits on the engine, the engine's bytes are that connection's
only events. The clock and the two actions use mitmproxy's proxy server
internals (its ``connections`` table, a handler's ``transports`` and
``close_connection``), for which mitmproxy 11 has no public API (killing a
flow in transit is mitmproxy issue 4711). They are all here, in one module;
``tests/capture/test_engine_failures.py`` runs each path through a real sidecar.
HTTP/1 harness connections only: for HTTP/2 (TLS with ALPN ``h2``) mitmproxy's
own error handling stays.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from mitmproxy import connection, ctx, http
from mitmproxy.net.http import http1

log = logging.getLogger(__name__)

DEFAULT_CONNECT_TIMEOUT = 10
DEFAULT_FIRST_BYTE_TIMEOUT = 300
DEFAULT_IDLE_TIMEOUT = 300

_OPTIONS = (
    (
        "openforge_engine_connect_timeout",
        DEFAULT_CONNECT_TIMEOUT,
        "Seconds a model call may wait for a new connection to the engine (0: no limit).",
    ),
    (
        "openforge_engine_first_byte_timeout",
        DEFAULT_FIRST_BYTE_TIMEOUT,
        "Seconds the engine may stay silent before its response head (0: no limit).",
    ),
    (
        "openforge_engine_idle_timeout",
        DEFAULT_IDLE_TIMEOUT,
        "Seconds the engine may stay silent within its answer (0: no limit).",
    ),
)


def add_options(loader: Any) -> None:
    """The deadlines' mitmproxy options (seconds; the capture addon loads them)."""
    for name, default, help_text in _OPTIONS:
        loader.add_option(name, int, default, help_text)


class Deadline:
    """Closes a call's engine connection when the engine is too slow (module docstring).

    Armed as the request leaves (:meth:`start`): a connection still being made
    has the connect limit, then the engine has the first-byte limit of silence;
    from the response head (:meth:`answering`) the idle limit; disarmed when
    the call ends (:meth:`cancel`). One timer at a time, re-armed for the time
    left, so a call that streams costs no timer per chunk.
    """

    def __init__(self, flow: http.HTTPFlow) -> None:
        self._flow = flow
        self._timer: asyncio.TimerHandle | None = None
        self._phase = ""  # "head" or "body"
        self._since = 0.0
        self.expired = ""  # which limit passed, e.g. "no response head within 300 s"

    def start(self) -> None:
        self._arm("head")

    def answering(self) -> None:
        self._arm("body")

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, phase: str) -> None:
        self.cancel()
        self._phase, self._since = phase, time.time()
        self._check()

    def _check(self) -> None:
        self._timer = None
        handler = _handler(self._flow.client_conn)
        if handler is None:
            return  # the harness is gone: mitmproxy ends the flow
        opts = ctx.options
        now = time.time()
        left: list[float] = []
        if self._phase == "head" and not self._flow.server_conn.connected:
            limit = opts.openforge_engine_connect_timeout  # still connecting
            if limit > 0:
                if now - self._since >= limit:
                    self.expired = f"no connection to the engine within {limit} s"
                    address = (self._flow.request.host, self._flow.request.port)
                    for server in list(handler.transports):
                        if (
                            isinstance(server, connection.Server)
                            and server.address == address
                            and server.timestamp_tcp_setup is None
                        ):
                            handler.close_connection(server)
                    return
                left.append(self._since + limit - now)
        limit = (
            opts.openforge_engine_first_byte_timeout
            if self._phase == "head"
            else opts.openforge_engine_idle_timeout
        )
        if limit > 0:
            silent = now - max(self._since, handler.timeout_watchdog.last_activity)
            if silent >= limit:
                what = "no response head" if self._phase == "head" else "nothing more"
                self.expired = f"{what} from the engine within {limit} s"
                close_server(self._flow.client_conn, self._flow.server_conn)
                return
            left.append(limit - silent)
        if left:
            self._timer = asyncio.get_running_loop().call_later(min(left), self._check)


def _handler(client: connection.Client) -> Any:
    """mitmproxy's handler of the harness's connection, if it is still open."""
    addons: Any = ctx.master.addons  # untyped in mitmproxy
    proxyserver = addons.get("proxyserver")
    return proxyserver.connections.get(client.id) if proxyserver is not None else None


def close_server(client: connection.Client, server: connection.Server) -> bool:
    """Close the engine connection ``server`` (connecting or open) of ``client``'s handler."""
    handler = _handler(client)
    if handler is None or server not in handler.transports:
        return False
    handler.close_connection(server)
    return True


def engine_failed(flow: http.HTTPFlow, deadline: Deadline | None) -> bool:
    """Whether a flow's error is the engine's (a deadline, a connection it refused or
    closed), not the harness's own hang-up."""
    if deadline is not None and deadline.expired:
        return True
    if not flow.client_conn.state & connection.ConnectionState.CAN_WRITE:
        return False  # the harness hung up (the engine connection may not even be made)
    server = flow.server_conn
    return bool(server.error) or not server.state & connection.ConnectionState.CAN_READ


def answer_client(flow: http.HTTPFlow, data: bytes) -> bool:
    """Write ``data`` to the harness and close its connection; False when that cannot be
    done (it hung up, or it speaks HTTP/2: mitmproxy's own error handling stays)."""
    client = flow.client_conn
    handler = _handler(client)
    if (
        handler is None
        or not client.state & connection.ConnectionState.CAN_WRITE
        or not flow.request.http_version.startswith("HTTP/1")
    ):
        return False
    transport = handler.transports.get(client)
    writer = transport.writer if transport is not None else None
    if writer is None or writer.is_closing():
        return False
    writer.write(data)
    handler.close_connection(client)  # its state first: mitmproxy writes nothing more
    return True


def error_response(status: int, body: bytes) -> bytes:
    """A whole HTTP/1.1 answer carrying the API's error object; the connection closes."""
    response = http.Response.make(
        status, body, {"content-type": "application/json", "connection": "close"}
    )
    assemble: Any = http1.assemble_response  # untyped in mitmproxy
    return bytes(assemble(response))


def rest_of_stream(response: http.Response, data: bytes) -> bytes:
    """``data`` as the last bytes of a streamed answer whose head was sent, framed as
    its body is. No end of the body follows: the connection closes after it, so the
    harness's HTTP client, having read the API's error event, sees the answer broken
    off and does not send its next call on this connection."""
    if "chunked" not in response.headers.get("transfer-encoding", "").lower():
        return data
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""
