"""The stock-mitmproxy baseline: a tee that copies each response chunk aside.

Load with ``mitmdump -s bench/tee_addon.py``. Every response is streamed
through a callable that appends the chunk to a per-flow list and returns it
unchanged, the least any capturing proxy must do (mitmproxy's
``examples/addons/http-stream-modify.py`` shape). It exists so the sidecar
is compared against mitmproxy's own cost, not against nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from mitmproxy import http


class Tee:
    def __init__(self) -> None:
        self.bytes_seen = 0

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is None:
            return
        chunks: list[bytes] = []
        flow.metadata["tee"] = chunks
        flow.response.stream = self._stream(chunks)

    def _stream(self, chunks: list[bytes]) -> Callable[[bytes], bytes]:
        def stream(data: bytes) -> bytes:
            chunks.append(data)
            self.bytes_seen += len(data)
            return data

        return stream


addons = [Tee()]
