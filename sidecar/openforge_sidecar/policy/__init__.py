"""The policy side of a captured call: the policy's chat template (``template``, with the
tokenizer's prefix-stable segments, ``segments``), the rollout's token history (``history``),
the tool-call parser of the policy's output (``toolparse``) and the engine's
token-in/token-out ``/v1/completions`` client (``engine``)."""
