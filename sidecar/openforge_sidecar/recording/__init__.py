"""What a sidecar records and how it reaches the collector: the trajectory records it
builds (``records``), the credentials it strips from them (``redact``), the fsynced spool
they wait in (``spool``) and the gRPC exporter that streams them (``exporter``)."""
