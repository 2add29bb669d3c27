"""Isolation with real packets: a rollout pod reaches only its sidecar's upstream (the
policy server) and DNS; it cannot reach the API server or another job's pods. The job's
NetworkPolicy (made by the operator, enforced by kube-router) is what stops them: the
same probes from a pod of the same image in the same namespace, outside the job, connect
(so this test can fail). An address off the node is refused to every pod anyway, by the
node's egress fence (``tests/kind/test_cluster.py``).

The probe is the rollout's harness itself: it connects to each target once (3 s timeout)
and prints one JSON object, which the test reads from the pod's log.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import kube_cluster
import pytest
import realpods
import yaml

pytestmark = [pytest.mark.kind, pytest.mark.slow]

NAMESPACE = "isolation"
JOB = f"probe-{uuid.uuid4().hex[:6]}"  # the collector binds a job's name to its first RolloutJob
IMAGE = "ghcr.io/openforge/react-harness:0.1.0"
PROBE = """
import json, os, socket
result = {}
for name, target in json.loads(os.environ["PROBE_TARGETS"]).items():
    host, port = target.rsplit(":", 1)
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((socket.gethostbyname(host), int(port))); result[name] = "connected"
    except OSError as error:
        result[name] = type(error).__name__
    finally:
        s.close()
print("PROBE " + json.dumps(result), flush=True)
"""


def targets(other_pod_ip: str) -> dict[str, str]:
    return {
        "policy": "policy.rl.svc.cluster.local:8000",
        "apiserver": "kubernetes.default.svc.cluster.local:443",
        "other-job-pod": f"{other_pod_ip}:8080",
    }


def harness_env(probe_targets: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "openforge.dev/v1alpha1",
        "kind": "HarnessEnv",
        "metadata": {"name": "probe"},
        "spec": {
            "api": "openai-chat",
            "baseUrl": {"env": ["OPENAI_BASE_URL"], "suffix": "/v1"},
            "template": {"spec": {"containers": [{
                "name": "harness", "image": IMAGE, "command": ["python", "-c", PROBE],
                "env": [{"name": "PROBE_TARGETS", "value": json.dumps(probe_targets)}],
                "resources": {"requests": {"cpu": "20m", "memory": "64Mi"}},
            }]}},
        },
    }  # fmt: skip


def probe_output(kind: kube_cluster.Kube, pod: str) -> dict[str, str]:
    logs = kind.kubectl("-n", NAMESPACE, "logs", pod, "-c", "harness").stdout
    lines = [line for line in logs.splitlines() if line.startswith("PROBE ")]
    assert lines, f"{pod}: no probe output:\n{logs}"
    result: dict[str, str] = json.loads(lines[-1].removeprefix("PROBE "))
    return result


@pytest.mark.timeout(900)
def test_a_rollout_pod_reaches_only_its_upstream(kind: kube_cluster.Kube) -> None:
    realpods.ensure_platform(kind)
    realpods.ensure_namespace(kind, NAMESPACE)
    # "another job's pod": a listener in another namespace
    realpods.ensure_namespace(kind, "isolation-other")
    kind.kubectl("-n", "isolation-other", "run", "web", f"--image={IMAGE}",
                 "--image-pull-policy=IfNotPresent", "--port=8080",
                 "--command", "--", "python", "-m", "http.server", "8080")  # fmt: skip
    kind.kubectl(
        "-n",
        "isolation-other",
        "wait",
        "pod/web",
        "--for=condition=Ready",
        "--timeout=180s",
        timeout=200,
    )
    other_ip = kind.get_json("-n", "isolation-other", "pod", "web")["status"]["podIP"]
    probe_targets = targets(other_ip)

    kind.kubectl(
        "-n",
        NAMESPACE,
        "apply",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(
            [
                harness_env(probe_targets),
                realpods.rollout_job(JOB, env="probe", tasks=[{"id": "probe"}]),
            ]
        ),
    )
    job = realpods.wait_job(kind, NAMESPACE, JOB, timeout=600)
    assert realpods.condition(job, "Complete"), job.get("status")
    policy = kind.get_json("-n", NAMESPACE, "networkpolicy", f"{JOB}-rollouts")
    assert (
        policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        or "Egress" in policy["spec"]["policyTypes"]
    )
    inside = probe_output(kind, f"{JOB}-0-0")
    assert inside["policy"] == "connected", inside
    sidecar_log = kind.kubectl("-n", NAMESPACE, "logs", f"{JOB}-0-0", "-c", realpods.SIDECAR).stdout
    assert "podagent: fenced after" in sidecar_log, sidecar_log[-3000:]
    assert inside["apiserver"] != "connected" and inside["other-job-pod"] != "connected", inside

    # the control: the same probes from a pod that no job's policy selects
    control = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "control"}, "spec": {
        "restartPolicy": "Never",
        "containers": [{"name": "harness", "image": IMAGE, "command": ["python", "-c", PROBE],
                        "env": [{"name": "PROBE_TARGETS", "value": json.dumps(probe_targets)}]}],
    }}  # fmt: skip
    kind.kubectl("-n", NAMESPACE, "apply", "-f", "-", stdin=json.dumps(control))
    deadline = time.monotonic() + 180
    while kind.get_json("-n", NAMESPACE, "pod", "control")["status"].get("phase") not in (
        "Succeeded",
        "Failed",
    ):
        assert time.monotonic() < deadline, "the control pod did not finish"
        time.sleep(2)
    outside = probe_output(kind, "control")
    assert outside == {name: "connected" for name in probe_targets}, outside
    for namespace in (NAMESPACE, "isolation-other"):
        kind.kubectl("delete", "namespace", namespace, "--wait=false")


LISTEN = """
import http.server, os, threading, time
server = http.server.ThreadingHTTPServer(("0.0.0.0", 8080), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("LISTENING", flush=True)
deadline = time.monotonic() + 300
while not os.path.exists("/tmp/go") and time.monotonic() < deadline:
    time.sleep(0.2)
"""
"""A harness that serves on 8080 until ``/tmp/go`` exists (at most 5 minutes)."""


def listener_env() -> dict[str, Any]:
    env = harness_env({})
    env["metadata"]["name"] = "listener"
    env["spec"]["template"]["spec"]["containers"][0]["command"] = ["python", "-c", LISTEN]
    return env


def probe(kind: kube_cluster.Kube, namespace: str, name: str, target: str) -> str:
    """Run a pod in ``namespace`` that connects once to ``target``; what it got."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "restartPolicy": "Never",
        "containers": [{"name": "harness", "image": IMAGE, "command": ["python", "-c", PROBE],
                        "env": [{"name": "PROBE_TARGETS",
                                 "value": json.dumps({"target": target})}]}],
    }}  # fmt: skip
    kind.kubectl("-n", namespace, "apply", "-f", "-", stdin=json.dumps(pod))
    kube_cluster.wait_for(
        lambda: (
            kind.get_json("-n", namespace, "pod", name)["status"].get("phase")
            in ("Succeeded", "Failed")
        ),
        what=f"probe {name}",
        timeout=180,
        interval=1,
    )
    logs = kind.kubectl("-n", namespace, "logs", name).stdout
    lines = [line for line in logs.splitlines() if line.startswith("PROBE ")]
    assert lines, f"{name}: no probe output:\n{logs}"
    return str(json.loads(lines[-1].removeprefix("PROBE "))["target"])


@pytest.mark.timeout(900)
def test_nothing_reaches_a_rollout_pod(kind: kube_cluster.Kube) -> None:
    """The job's NetworkPolicy admits no ingress: a pod of another namespace cannot connect
    to a port the rollout pod's harness serves on, and can to the same listener in a pod
    that no policy selects (the control)."""
    realpods.ensure_platform(kind)
    namespace, job = "isolation-in", f"listen-{uuid.uuid4().hex[:6]}"
    for name in (namespace, "isolation-in-other"):
        realpods.ensure_namespace(kind, name)
    job_spec = realpods.rollout_job(job, env="listener", tasks=[{"id": "t"}])
    realpods.apply(kind, namespace, listener_env(), job_spec)
    pod_name = f"{job}-0-0"
    kube_cluster.wait_for(
        lambda: (
            "LISTENING"
            in kind.kubectl("-n", namespace, "logs", pod_name, "-c", "harness", check=False).stdout
        ),
        what=f"{pod_name} listening",
        timeout=300,
        interval=1,
    )
    rollout_ip = kind.get_json("-n", namespace, "pod", pod_name)["status"]["podIP"]
    refused = probe(kind, "isolation-in-other", "probe-rollout", f"{rollout_ip}:8080")
    assert refused != "connected", refused

    control = listener_env()["spec"]["template"]["spec"]["containers"][0]
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
             "spec": {"restartPolicy": "Never", "containers": [control]}}  # fmt: skip
    kind.kubectl("-n", namespace, "apply", "-f", "-", stdin=json.dumps(plain))
    kube_cluster.wait_for(
        lambda: "LISTENING" in kind.kubectl("-n", namespace, "logs", "plain", check=False).stdout,
        what="the control listening",
        timeout=180,
        interval=1,
    )
    plain_ip = kind.get_json("-n", namespace, "pod", "plain")["status"]["podIP"]
    assert probe(kind, "isolation-in-other", "probe-plain", f"{plain_ip}:8080") == "connected"

    kind.kubectl("-n", namespace, "exec", pod_name, "-c", "harness", "--", "touch", "/tmp/go")
    done = realpods.wait_job(kind, namespace, job, timeout=300)
    assert realpods.condition(done, "Complete"), done.get("status")
    for name in (namespace, "isolation-in-other"):
        kind.kubectl("delete", "namespace", name, "--wait=false")


GATED_PROBE = """
import json, os, socket, time
def once(target):
    host, port = target.rsplit(":", 1)
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect((socket.gethostbyname(host), int(port))); return "connected"
    except OSError as error:
        return type(error).__name__
    finally:
        s.close()
result = {}
for name, target in json.loads(os.environ["PROBE_TARGETS"]).items():
    for _ in range(8):  # a changed policy reaches the enforcer a little after it is written
        result[name] = once(target)
        if result[name] == "connected":
            break
        time.sleep(1)
print("PROBE " + json.dumps(result), flush=True)
deadline = time.monotonic() + 300
while not os.path.exists("/tmp/go") and time.monotonic() < deadline:
    time.sleep(0.2)
"""
"""Probes each target (a few tries), prints the result, then waits for ``/tmp/go``."""

TWO_PORTS = """
import http.server, threading
handler = http.server.SimpleHTTPRequestHandler
for port in (8080, 8081):
    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
threading.Event().wait()
"""


@pytest.mark.timeout(900)
def test_allowed_hosts_open_what_they_name_and_a_changed_list_reaches_the_policy(
    kind: kube_cluster.Kube,
) -> None:
    """``capture.allowedHosts`` opens egress to what it names and nothing more, and a
    HarnessEnv changed mid-job is patched into the job's policy before its next pod:
    ``web.<namespace>.svc:8080`` admits that namespace's pods on 8080, not on 8081; then
    ``<pod IP>:8081`` admits that address on 8081 too; then, the list replaced, a bare
    name with a port admits the job's own namespace on it, a name without a port is 80 and
    443, an external name admits no pod address, and the entries dropped are closed."""
    realpods.ensure_platform(kind)
    suffix = uuid.uuid4().hex[:6]
    namespace, other, job = f"allowed-{suffix}", f"allowed-web-{suffix}", f"allow-{suffix}"
    for name in (namespace, other):
        realpods.ensure_namespace(kind, name)
    kind.kubectl("-n", other, "run", "web", f"--image={IMAGE}", "--image-pull-policy=IfNotPresent",
                 "--command", "--", "python", "-c", TWO_PORTS)  # fmt: skip
    kind.kubectl(
        "-n", other, "wait", "pod/web", "--for=condition=Ready", "--timeout=180s", timeout=200
    )
    web = kind.get_json("-n", other, "pod", "web")["status"]["podIP"]
    env = harness_env({"8080": f"{web}:8080", "8081": f"{web}:8081"})
    env["spec"]["template"]["spec"]["containers"][0]["command"] = ["python", "-c", GATED_PROBE]
    env["spec"]["capture"] = {"allowedHosts": []}
    tasks = [{"id": "a"}, {"id": "b"}, {"id": "c"}, {"id": "d"}]
    spec = realpods.rollout_job(job, env="probe", tasks=tasks, parallelism=1)
    realpods.apply(kind, namespace, env, spec)

    def probed(pod: str) -> dict[str, str]:
        found: dict[str, str] = {}

        def printed() -> bool:
            logs = kind.kubectl("-n", namespace, "logs", pod, "-c", "harness", check=False).stdout
            lines = [line for line in logs.splitlines() if line.startswith("PROBE ")]
            if lines:
                found.update(json.loads(lines[-1].removeprefix("PROBE ")))
            return bool(lines)

        kube_cluster.wait_for(printed, what=f"{pod} probed", timeout=300, interval=1)
        return found

    first, second = f"{job}-0-0", f"{job}-1-0"
    before = probed(first)
    assert before["8080"] != "connected" and before["8081"] != "connected", before
    env["spec"]["capture"] = {"allowedHosts": [f"web.{other}.svc:8080"]}
    realpods.apply(kind, namespace, env)
    kind.kubectl("-n", namespace, "exec", first, "-c", "harness", "--", "touch", "/tmp/go")
    after = probed(second)
    assert after["8080"] == "connected" and after["8081"] != "connected", after
    # an IP literal opens that address alone, on that port
    env["spec"]["capture"] = {"allowedHosts": [f"web.{other}.svc:8080", f"{web}:8081"]}
    realpods.apply(kind, namespace, env)

    def policy_of() -> list[dict[str, Any]]:
        policy = kind.get_json("-n", namespace, "networkpolicy", f"{job}-rollouts")
        rules: list[dict[str, Any]] = policy["spec"]["egress"]
        return rules

    opened = [
        rule
        for rule in policy_of()
        if any(peer.get("namespaceSelector", {}).get("matchLabels", {}).get(
            "kubernetes.io/metadata.name") == other for peer in rule.get("to", []))
    ]  # fmt: skip
    assert [p["port"] for rule in opened for p in rule["ports"]] == [8080], opened
    kind.kubectl("-n", namespace, "exec", second, "-c", "harness", "--", "touch", "/tmp/go")
    third = probed(f"{job}-2-0")
    assert third == {"8080": "connected", "8081": "connected"}, third
    blocks = [peer.get("ipBlock") for rule in policy_of() for peer in rule.get("to", [])]
    assert {"cidr": f"{web}/32"} in blocks, blocks
    # the other forms, the list replaced: a bare name opens the job's own namespace on that
    # port; a name without a port, 80 and 443; any other name, addresses outside the
    # private ranges only (so not a pod's); and what left the list is closed again
    kind.kubectl("-n", namespace, "run", "web", f"--image={IMAGE}",
                 "--image-pull-policy=IfNotPresent",
                 "--command", "--", "python", "-m", "http.server", "8082")  # fmt: skip
    kind.kubectl(
        "-n", namespace, "wait", "pod/web", "--for=condition=Ready", "--timeout=180s", timeout=200
    )
    own = kind.get_json("-n", namespace, "pod", "web")["status"]["podIP"]
    env["spec"]["capture"] = {
        "allowedHosts": ["web:8082", f"web.{other}.svc", "llm.example.com:8081"]
    }
    container = env["spec"]["template"]["spec"]["containers"][0]
    targets = {"own 8082": f"{own}:8082", "8080": f"{web}:8080", "8081": f"{web}:8081"}
    container["env"] = [{"name": "PROBE_TARGETS", "value": json.dumps(targets)}]
    realpods.apply(kind, namespace, env)
    kind.kubectl("-n", namespace, "exec", f"{job}-2-0", "-c", "harness", "--", "touch", "/tmp/go")
    fourth = probed(f"{job}-3-0")
    assert fourth["own 8082"] == "connected", fourth
    assert fourth["8080"] != "connected" and fourth["8081"] != "connected", fourth
    rules = {
        json.dumps(rule["to"], sort_keys=True): [p["port"] for p in rule["ports"]]
        for rule in policy_of()
    }
    to_own = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}]
    to_other = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": other}}}]
    assert rules[json.dumps(to_own, sort_keys=True)] == [8082], rules
    assert rules[json.dumps(to_other, sort_keys=True)] == [80, 443], rules
    outside = [r for r in policy_of() if r["to"][0].get("ipBlock", {}).get("cidr") == "0.0.0.0/0"]
    assert [p["port"] for r in outside for p in r["ports"]] == [8081], outside
    kind.kubectl("-n", namespace, "exec", f"{job}-3-0", "-c", "harness", "--", "touch", "/tmp/go")
    done = realpods.wait_job(kind, namespace, job, timeout=300)
    assert realpods.condition(done, "Complete"), done.get("status")
    for name in (namespace, other):
        kind.kubectl("delete", "namespace", name, "--wait=false")


@pytest.mark.timeout(600)
def test_a_pod_its_policy_leaves_unfenced_never_runs_its_harness(kind: kube_cluster.Kube) -> None:
    """The in-pod agent lets the harness start only once the pod cannot reach the API
    server. A HarnessEnv whose ``allowedHosts`` admit the API server (its Service address
    and the endpoint behind it) leaves the pod unfenced: after the operator's
    ``--fence-wait-seconds`` (the chart's 60) the attempt is SidecarFailed, the harness
    never ran, and the rollout is stored failed, with no call, never trained."""
    realpods.ensure_platform(kind)
    name = f"unfenced-{uuid.uuid4().hex[:6]}"
    realpods.ensure_namespace(kind, name)
    service = kind.get_json("-n", "default", "service", "kubernetes")["spec"]["clusterIP"]
    [subset] = kind.get_json("-n", "default", "endpoints", "kubernetes")["subsets"]
    endpoint = f"{subset['addresses'][0]['ip']}:{subset['ports'][0]['port']}"
    env = realpods.stepped_env(name, 1)
    env["spec"]["capture"] = {"allowedHosts": [f"{service}:443", endpoint]}
    job = realpods.rollout_job(
        name, env=name, tasks=[{"id": "t0"}], maxAttemptsPerRollout=2,
        failurePolicy={"rules": [{"action": "FailRollout", "onReasons": ["SidecarFailed"]}]},
    )  # fmt: skip
    realpods.apply(kind, name, env, job)
    done = realpods.wait_job(kind, name, name, timeout=400)
    assert realpods.condition(done, "Failed"), (done["status"], realpods.events(kind, name)[-3000:])
    [pod] = realpods.pods_of(kind, name, name)
    pod_name = pod["metadata"]["name"]
    terminated = realpods.container_status(pod, "harness")["state"]["terminated"]
    verdict = json.loads(terminated["message"])
    assert verdict["reason"] == "SidecarFailed", verdict
    assert "did not enforce the job's NetworkPolicy" in verdict["message"], verdict
    harness = kind.kubectl("-n", name, "logs", pod_name, "-c", "harness").stdout
    assert "answered" not in harness, harness  # the harness never ran
    sidecar = kind.kubectl("-n", name, "logs", pod_name, "-c", realpods.SIDECAR).stdout
    assert "still not fenced after 60 s" in sidecar, sidecar[-3000:]
    [stored] = realpods.store_summary(kind, name)["rollouts"]
    assert stored["calls"] == [] and not stored["has_reward"] and not stored["trained"], stored
    kind.kubectl("delete", "namespace", name, "--wait=false")
