"""Connection limits: what a client may hold of the sidecar before it has said anything.

mitmproxy closes a connection only after 10 minutes without a byte, and takes
as many as come. A client that opens connections and sends nothing, or
never finishes a request head (one byte now and then keeps mitmproxy's
inactivity timer happy), would hold them, each with its buffers and tasks.
So the sidecar

* refuses a connection beyond ``openforge_max_connections`` open at once
  (closed at once, counted ``connections_refused``), and
* closes a connection that has not sent a whole request head within
  ``openforge_header_timeout`` seconds of connecting (``header_timeouts``).

Only a connection's first request is timed: a kept-alive connection that is
idle between requests is left to mitmproxy, since a client may reuse it for
its next call whenever it likes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

from mitmproxy import connection, ctx, http

log = logging.getLogger("openforge.sidecar")

DEFAULT_MAX_CONNECTIONS = 512
DEFAULT_HEADER_TIMEOUT = 30


class ConnectionGuard:
    def __init__(self, stats: Counter[str]) -> None:
        self.stats = stats
        self._open: set[str] = set()
        self._spoke: set[str] = set()

    def load(self, loader: Any) -> None:
        loader.add_option(
            "openforge_max_connections",
            int,
            DEFAULT_MAX_CONNECTIONS,
            "Client connections open at once; one more is closed as it connects. 0: no limit.",
        )
        loader.add_option(
            "openforge_header_timeout",
            int,
            DEFAULT_HEADER_TIMEOUT,
            "Seconds a new client connection has to send its first whole request head before "
            "it is closed. 0: no limit.",
        )

    def client_connected(self, client: connection.Client) -> None:
        limit = ctx.options.openforge_max_connections
        if limit > 0 and len(self._open) >= limit:
            client.error = f"more than {limit} connections open at once"
            self.stats["connections_refused"] += 1
            log.warning("refused a connection from %s: %s", client.peername, client.error)
            return
        self._open.add(client.id)
        timeout = ctx.options.openforge_header_timeout
        if timeout > 0:
            asyncio.get_running_loop().call_later(timeout, self._unheard, client, timeout)

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        self._spoke.add(flow.client_conn.id)

    def http_connect(self, flow: http.HTTPFlow) -> None:
        self._spoke.add(flow.client_conn.id)  # a proxy client's CONNECT is its first request

    def client_disconnected(self, client: connection.Client) -> None:
        self._open.discard(client.id)
        self._spoke.discard(client.id)

    def _unheard(self, client: connection.Client, timeout: int) -> None:
        """Close ``client``'s connection if it is open and has sent no request head."""
        if client.id not in self._open or client.id in self._spoke:
            return
        addons: Any = ctx.master.addons  # the manager's methods are untyped
        server = addons.get("proxyserver")
        handler = server.connections.get(client.id) if server is not None else None
        io = handler.transports.get(handler.client) if handler is not None else None
        if io is None or io.handler is None:
            return
        self.stats["header_timeouts"] += 1
        log.warning(
            "closing the connection from %s: no request head within %d s", client.peername, timeout
        )
        io.handler.cancel("no request head in time")
