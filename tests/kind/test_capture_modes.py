"""Every capture mode with real harnesses in real pods: BaseURL, Proxy (the harness
trusts the job's CA) and Transparent (the iptables init container redirects the pod's
egress, the sidecar's own user excepted), each with every call captured token-exactly.

Each case is a two-rollout RolloutJob in its own namespace against the demo's policy
server (``http://policy.rl.svc:8000``) and the chart's collector. In Proxy mode the
harness is pointed at a host that does not exist (``.test`` is reserved): only the
sidecar, intercepting TLS with the job's CA, can answer it. In Transparent mode the
harness calls the policy Service itself over HTTPS; the redirect hands the connection
to the sidecar, which presents the job's CA for that name.
"""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path
from typing import Any

import kube_cluster
import pytest
import realpods
import yaml

pytestmark = [pytest.mark.kind, pytest.mark.slow]

CATALOG = Path(__file__).resolve().parents[2] / "examples" / "harnesses"
TASKS = Path(__file__).resolve().parents[2] / "examples" / "cluster" / "tasks.yaml"
NOWHERE = "https://llm.openforge.test"
POLICY_TLS = "https://policy.rl.svc:8000"

# harness, mode, the env var the harness reads its endpoint from, that endpoint, wire API
CASES = [
    ("react", "Proxy", "OPENAI_BASE_URL", f"{NOWHERE}/v1", "WIRE_API_OPENAI_CHAT"),
    ("react", "Transparent", "OPENAI_BASE_URL", f"{POLICY_TLS}/v1", "WIRE_API_OPENAI_CHAT"),
    ("codex", "BaseURL", None, None, "WIRE_API_OPENAI_RESPONSES"),
    ("codex", "Proxy", "OPENAI_BASE_URL", f"{NOWHERE}/v1", "WIRE_API_OPENAI_RESPONSES"),
    ("codex", "Transparent", "OPENAI_BASE_URL", f"{POLICY_TLS}/v1", "WIRE_API_OPENAI_RESPONSES"),
    ("claude-code", "Proxy", "ANTHROPIC_BASE_URL", NOWHERE, "WIRE_API_ANTHROPIC_MESSAGES"),
]
# Codex's own 17 KB system prompt does not fit the tiny policy's 4,096 tokens: the demo's
# short instructions replace it, as examples/codex-toy.yaml does locally.
EXTRA_ARGS = {"codex": " --instructions /opt/openforge/harnesses/codex/instructions.md"}
# Claude Code's own system prompt and tool schemas do not fit either: it runs against the
# test engine (token-exact like the policy server, with a 32k context) instead.
ENGINES = {"claude-code": realpods.ENGINE_ENDPOINT}
TWO_TASKS = [
    json.loads(line)
    for line in yaml.safe_load(TASKS.read_text())["data"]["tasks.jsonl"].splitlines()[:2]
]


def harness_env(
    harness: str, mode: str, variable: str | None, endpoint: str | None, name: str
) -> dict[str, Any]:
    env: dict[str, Any] = copy.deepcopy(
        yaml.safe_load((CATALOG / harness / "harnessenv.yaml").read_text())
    )
    env["metadata"] = {"name": name}
    env["spec"]["capture"] = {"mode": mode}
    env["spec"].pop("local", None)
    container = env["spec"]["template"]["spec"]["containers"][0]
    container["args"] = [container["args"][0] + EXTRA_ARGS.get(harness, "")]
    if variable is not None:
        env["spec"].pop("baseUrl", None)
        container["env"] = [*container.get("env", []), {"name": variable, "value": endpoint}]
    return env


def policy(harness: str) -> dict[str, Any]:
    """The job's policy: the demo's policy server, or the test engine for a harness that needs more
    context."""
    return (
        {"policy": {"endpoint": ENGINES[harness], "model": "tiny-react"}}
        if harness in ENGINES
        else {}
    )


@pytest.fixture(scope="module")
def platform(kind: kube_cluster.Kube) -> kube_cluster.Kube:
    realpods.ensure_platform(kind)
    realpods.ensure_engine(kind)
    return kind


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(
    ("harness", "mode", "variable", "endpoint", "api"),
    CASES,
    ids=[f"{h}-{m}" for h, m, *_ in CASES],
)
def test_every_call_is_captured(
    platform: kube_cluster.Kube,
    harness: str,
    mode: str,
    variable: str | None,
    endpoint: str | None,
    api: str,
) -> None:
    kind = platform
    # a new name each run: the collector binds a job's name to the first RolloutJob (uid) that wrote
    # it
    name = f"capture-{harness}-{mode.lower()}-{uuid.uuid4().hex[:6]}"
    realpods.ensure_namespace(kind, name)
    manifest = yaml.safe_dump_all(
        [
            harness_env(harness, mode, variable, endpoint, name),
            realpods.rollout_job(
                name,
                env=name,
                tasks=TWO_TASKS,
                parallelism=2,
                rolloutTimeoutSeconds=300,
                **policy(harness),
            ),
        ]
    )
    kind.kubectl("-n", name, "apply", "-f", "-", stdin=manifest)

    job = realpods.wait_job(kind, name, name, timeout=900)
    events = realpods.events(kind, name)
    assert realpods.condition(job, "Complete"), (
        f"{name}: {job.get('status')}\nevents:\n{events[-4000:]}"
    )
    pods = realpods.pods_of(kind, name, name)
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        realpods.check_sidecar_first(pod)
        init = [c["name"] for c in pod["spec"]["initContainers"]]
        assert ("openforge-redirect" in init) == (mode == "Transparent"), init

    summary = realpods.store_summary(kind, name)
    assert summary["lost"] == [], summary["lost"]
    assert len(summary["rollouts"]) == 2, summary["rollouts"]
    for rollout in summary["rollouts"]:
        assert rollout["finished"] and rollout["complete"] and rollout["has_reward"], rollout
        assert rollout["calls"], f"{rollout['id']}: no call captured"
        for call in rollout["calls"]:
            # rewritten to token-in/token-out whatever the network path (a passthrough call would
            # say so)
            assert call["mode"] == "CAPTURE_MODE_TOKENS" and call["api"] == api, (
                rollout["id"],
                call,
            )
            assert (
                call["status"] == 200
                and call["exact"]
                and call["completion_tokens"] == call["logprobs"] > 0
            ), (rollout["id"], call)
    kind.kubectl("delete", "namespace", name, "--wait=false")
