"""What a sidecar records and how it reaches the collector: the recorder that owns one
rollout's records from a finished call to the collector's acknowledgement (``recorder``:
call indexes, the in-flight journal, loss reports, the spool writer, the exporter), the
trajectory records it builds (``records``), the credentials it strips from them
(``redact``), the fsynced spool they wait in (``spool``), the gRPC exporter that streams
them (``exporter``), what a restarted sidecar resumes (``resume``) and the drain that
sends a dead sidecar's spool (``drain``)."""
