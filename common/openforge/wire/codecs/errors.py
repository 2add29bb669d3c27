"""The one error every codec raises for input it cannot accept."""

from __future__ import annotations


class CodecError(ValueError):
    """A request or response body that does not fit its wire API.

    ``field`` is a JSON path to the value at fault (``messages[2].content``),
    or "" when the body as a whole is at fault (not JSON, not an object).
    ``status`` is the HTTP status the real API would answer with.
    """

    def __init__(self, message: str, *, field: str = "", status: int = 400) -> None:
        self.field = field
        self.status = status
        super().__init__(f"{field}: {message}" if field else message)
