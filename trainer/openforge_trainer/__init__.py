"""OpenForge trainer side: collector, durable store, export, engines and training."""
