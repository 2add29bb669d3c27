"""What a grader's output means: the one rule ``openforge run`` and the in-pod agent share.

A HarnessEnv's grader either prints JSON (``rewardFrom: stdout-json``; the last
line that parses as JSON must hold a finite numeric ``reward``) or exits (``exit-code``:
0 is reward 1, anything else 0). Both the local runner and the operator's in-pod
agent call :func:`reward`, so a rollout is scored the same on a laptop and on a
cluster.
"""

from __future__ import annotations

import json
import math

REWARD_KEY = "reward"


def reward(reward_from: str, *, stdout: str, exit_code: int) -> tuple[float | None, str]:
    """The reward a grader's output gives, and why there is none (``""`` when there is)."""
    if reward_from == "exit-code":
        return (1.0 if exit_code == 0 else 0.0), ""
    for line in reversed(stdout.strip().splitlines()):
        try:
            body = json.loads(line)
        except ValueError:
            continue
        value = body.get(REWARD_KEY) if isinstance(body, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):  # Python's JSON reads NaN and Infinity
                return (
                    None,
                    f"grader printed a {REWARD_KEY!r} that is not a finite number ({value}): "
                    f"{line[:200]}",
                )
            return float(value), ""
        return None, f"grader printed JSON without a numeric {REWARD_KEY!r}: {line[:200]}"
    return None, f"grader printed no JSON line (exit {exit_code}): {stdout[-200:]!r}"
