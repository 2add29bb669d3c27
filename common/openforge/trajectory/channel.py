"""gRPC settings that both ends of the record stream (exporter and collector) share."""

from __future__ import annotations

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""The largest message either end sends or takes. gRPC's default of 4 MiB refused a call
record holding a 5 MB request (``Received message larger than max``), and the refusal
stalled that sidecar's export for good. The sidecar takes request bodies up to 32 MiB
(``openforge_max_body``); a record holds the request, the response and their tokens."""


def options() -> list[tuple[str, int]]:
    """Channel and server options: send and receive up to :data:`MAX_MESSAGE_BYTES`."""
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]


RECORD_PARTS_METADATA = "openforge-record-parts"
"""Initial metadata a collector sends on ``Push`` when it joins records sent in parts
(``RecordPart``): a sender then cuts a large record into parts of :data:`PART_BYTES`,
and holds one part at a time, not the whole record and gRPC's copy of it."""

PART_BYTES = 256 * 1024
"""The data in one ``RecordPart``; a record longer than this is sent in parts. A sender
holds a part about twice at once (its piece and the message, then gRPC's copy): a
quarter megabyte each keeps that small beside a 1 MB call, at a few dozen microseconds
a part."""
