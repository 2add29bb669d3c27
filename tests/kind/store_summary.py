"""Run inside the collector container (``kubectl exec -i ... python - STORE JOB``): the job's
rollouts and their calls from the real store, as one JSON object on stdout.

Standard library plus the trainer image's own ``openforge_trainer.collection.store``; the test
reads nothing from the store but this.
"""

import json
import sys

from openforge_trainer.collection import store

path, job = sys.argv[1], sys.argv[2]
db = store.Store(path)
rollouts = []
for rollout in db.rollouts(job):
    calls = db.calls(rollout.rollout_id)
    rollouts.append(
        {
            "id": rollout.rollout_id,
            "task": rollout.task_id,
            "sample": rollout.sample_index,
            "attempt": rollout.attempt,
            "status": rollout.status,
            "reward": rollout.reward,
            "has_reward": rollout.has_reward,
            "finished": rollout.finished,
            "complete": rollout.complete,
            "policy_version": rollout.policy_version,
            "expected": rollout.call_count_expected,
            "trained": rollout.trained_at is not None,
            "calls": [
                {
                    "index": c.call_index,
                    "mode": c.capture_mode,
                    "api": c.wire_api,
                    "status": c.http_status,
                    "exact": c.token_exact,
                    "version": c.policy_version,
                    "completion_tokens": len(c.completion_token_ids),
                    "logprobs": len(c.completion_logprobs),
                }
                for c in calls
            ],
        }
    )
lost = [{"rollout": r.rollout_id, "reason": r.reason} for r in db.lost(job)]
json.dump({"rollouts": rollouts, "lost": lost, "records": db.record_count(job)}, sys.stdout)
