"""Collection: the collector (the gRPC service sidecars stream records to) and the durable store it
writes, exactly once per record."""
