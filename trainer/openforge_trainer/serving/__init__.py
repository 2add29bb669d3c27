"""Serving: ``openforge serve`` (``server``: continuous batching, live weight updates) and the
``/v1/completions`` protocol it and the test engine speak (``completions``), the weights' wire
format (``weights``), publishing new weights to the servers (``publish``) and the vLLM worker
extension."""
