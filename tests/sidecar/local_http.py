"""A local HTTP server for the sidecar's tests: an engine's ``/v1/models``, its files."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served on 127.0.0.1 while the block runs; its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def models(name: str, *, before: Callable[[], None] = lambda: None) -> type[BaseHTTPRequestHandler]:
    """A handler answering every GET with an engine's model list naming ``name``, once
    ``before()`` returns."""

    class Models(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            before()
            body = json.dumps({"data": [{"id": name}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Models
