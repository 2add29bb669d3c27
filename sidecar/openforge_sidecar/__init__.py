"""The OpenForge capture sidecar: answers a harness's LLM calls from the policy
and records each call, token-exact, as training data."""
