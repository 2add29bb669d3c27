"""OpenForge's own HTTP paths and headers, beside the model APIs they share a port with.

Every server and client names them from here: the sidecar's control API (on the port
the harness calls), the inference engine's extras (``openforge serve``, the test
engine, and what a vLLM deployment is fronted with) and the clients of both (the in-pod
agent, ``openforge run``, the weight publisher). ``tests/common/test_endpoints.py``
holds every module to it: no other string in the packages spells a ``/openforge/v1/``
path.
"""

from __future__ import annotations

PREFIX = "/openforge/v1/"
"""Every OpenForge path starts so; the sidecar never forwards one to the engine."""

# The sidecar's control API
ROLLOUT_FINISH = PREFIX + "rollout/finish"
"""POST: the runner reports the rollout (exit code, reward, status); needs the control token."""
STATS = PREFIX + "stats"
"""GET: the sidecar's counters."""

# The inference engine's extras
POLICY = PREFIX + "policy"
"""GET: ``{"model", "policy_version"}``."""
STATUS = PREFIX + "status"
"""GET: policy version, paused, running, waiting."""
TOKENIZER = PREFIX + "tokenizer"
"""GET ``TOKENIZER/<file>``: the policy tokenizer's files."""
WEIGHTS = PREFIX + "weights"
"""POST: load new weights without a restart."""
PAUSE = PREFIX + "pause"
"""POST: stop starting generations (running ones finish)."""
RESUME = PREFIX + "resume"
"""POST: start generations again."""

POLICY_VERSION_HEADER = "x-openforge-policy-version"
"""The engine's response header naming the policy version that generated it."""
