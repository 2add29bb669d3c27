"""Rollout pods on the real kind cluster, side by side with a bare Indexed Job in one run:
start-up latency, the sidecar's memory, and rollouts per minute.

The harness is the same in every pod: the ReAct harness image running a one-call
client (one call, ``max_tokens`` 8, then exit; it retries a refused connection once a
second). Through the operator it runs in a RolloutJob (BaseURL mode: a Chat Completions
call to the sidecar, which renders it into tokens, takes the completion's tokens and
logprobs from the policy server and streams the record to the collector); in the bare
Indexed Job it calls the policy Service (``http://policy.rl.svc:8000``) directly, with
no sidecar, as a token-ID completion of a prompt of the same length (the policy server
speaks only that).

1. **Start-up.** ``--rollouts`` rollouts at ``--parallelism``, then as many
   completions of the Job. A watch on each namespace's pods notes when each pod was
   seen created and scheduled, when its sidecar container had started (the kubelet's
   ``started``) and when its harness was running; the harness's log line ``answered``,
   timestamped by the container runtime (``kubectl logs --timestamps``), says when
   its first call was answered. Images are present on the node before the run.
2. **Memory.** ``--memory-pods`` rollouts whose client waits after its call; the
   sidecar container's memory cgroup is read inside the node (usage, peak, rss).
3. **Throughput.** For each ``--throughput-parallelism`` P, ``--throughput-rollouts``
   rollouts through the operator, then as many completions of the Job at P: rollouts
   per minute from creating the object to its last pod Succeeded.

Prints a table, the ratios (operator / Job), then ``--- json ---`` and a JSON summary.

    bash scripts/kind-up.sh up && bash scripts/kind-up.sh images
    python bench/kind_startup.py                       # 50 x 10, memory of 5, 100 x 20 and 100 x 50

It installs the chart and the demo's policy server as the kind tier does (without the
demo's RolloutJob), with sidecar requests small enough for 50 pods on a 2-core node
(``--sidecar-resources``), and deletes its namespaces at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
KIND_UP = ROOT / "scripts" / "kind-up.sh"
CHART = ROOT / "charts" / "openforge"
EXAMPLES = ROOT / "examples" / "cluster"
IMAGE = "ghcr.io/openforge/react-harness:0.1.0"
POLICY = "http://policy.rl.svc:8000"
COLLECTOR = "openforge-collector.openforge.svc:50051"
SIDECAR = "openforge-sidecar"
BARE_PROMPT = list(range(10, 34))
"""The bare Job's prompt: 24 token IDs, about what the chat template makes of the
operator side's one message (the policy server speaks only token-ID completions;
rendering chat into tokens is the sidecar's work, part of what is measured)."""
HARNESS_RESOURCES = {"requests": {"cpu": "1m", "memory": "16Mi"}, "limits": {"memory": "256Mi"}}
SIDECAR_RESOURCES = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "1Gi"}}
CLIENT = """
import json, os, sys, time, urllib.request
ids = os.environ.get("PROMPT_IDS")  # the bare Job: the engine's own token-ID completions
if ids:
    path, body = "/completions", {"model": "tiny-react", "max_tokens": 8, "prompt": json.loads(ids)}
else:
    path, body = "/chat/completions", {
        "model": "tiny-react", "max_tokens": 8,
        "messages": [{"role": "user", "content": "Say hello."}],
    }
body = json.dumps(body).encode()
for attempt in range(120):
    try:
        request = urllib.request.Request(
            os.environ["OPENAI_BASE_URL"] + path, body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            json.load(response)
        break
    except OSError as error:
        print(f"try {attempt}: {error}", flush=True)
        time.sleep(1)
else:
    sys.exit(4)
print("answered", flush=True)
time.sleep(float(os.environ.get("HOLD_SECONDS", "0")))
"""


class Cluster:
    def __init__(self, kubeconfig: str, kubectl: str, helm: str) -> None:
        self.kubeconfig, self.kubectl_path, self.helm = kubeconfig, kubectl, helm

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120
    ) -> str:
        result = subprocess.run(
            [self.kubectl_path, "--kubeconfig", self.kubeconfig, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def get(self, *args: str) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json"))
        return parsed


@dataclass
class PodTimes:
    created: float
    scheduled: float | None = None
    sidecar_started: float | None = None
    harness_running: float | None = None
    succeeded: float | None = None
    answered: float | None = None
    node: str = ""
    uid: str = ""


@dataclass
class Watch:
    """Every pod of one namespace, as a pod watch (``?watch=1``) saw it, in wall-clock seconds."""

    cluster: Cluster
    namespace: str
    pods: dict[str, PodTimes] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stopped = threading.Event()
        self._process: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """Watch from a list's resourceVersion; whenever the API server ends the watch
        (it does, and sooner on a loaded node), list again and watch on."""
        base = f"/api/v1/namespaces/{self.namespace}/pods"
        while not self._stopped.is_set():
            listed = json.loads(self.cluster.kubectl("get", "--raw", base))
            now = time.time()
            for pod in listed["items"]:
                self._see(pod, now)
            path = f"{base}?watch=1&resourceVersion={listed['metadata']['resourceVersion']}"
            self._process = subprocess.Popen(
                [
                    self.cluster.kubectl_path,
                    "--kubeconfig",
                    self.cluster.kubeconfig,
                    "get",
                    "--raw",
                    path,
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert self._process.stdout is not None
            for line in self._process.stdout:
                now = time.time()
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("type") == "ERROR":  # 410 Gone: list again
                    break
                self._see(event["object"], now)
            self._process.terminate()
            self._process.wait(timeout=10)

    def _see(self, pod: dict[str, Any], now: float) -> None:
        name = pod["metadata"]["name"]
        times = self.pods.setdefault(name, PodTimes(created=now, uid=pod["metadata"]["uid"]))
        spec, status = pod.get("spec", {}), pod.get("status", {})
        if spec.get("nodeName") and times.scheduled is None:
            times.scheduled, times.node = now, spec["nodeName"]
        for container in status.get("initContainerStatuses", []):
            if (
                container["name"] == SIDECAR
                and container.get("started")
                and times.sidecar_started is None
            ):
                times.sidecar_started = now
        for container in status.get("containerStatuses", []):
            if (
                container["name"] == "harness"
                and "running" in container.get("state", {})
                and times.harness_running is None
            ):
                times.harness_running = now
        if status.get("phase") == "Succeeded" and times.succeeded is None:
            times.succeeded = now
        if status.get("phase") == "Failed" and name not in self.failed:
            self.failed.append(name)

    def done(self, count: int) -> bool:
        return sum(1 for t in self.pods.values() if t.succeeded is not None) >= count

    def stop(self) -> None:
        self._stopped.set()
        if self._process is not None:
            self._process.terminate()
        self._thread.join(timeout=30)

    def fetch_answers(self) -> None:
        """Each pod's first-call-answered time, from its harness log's runtime timestamps."""
        for name, times in self.pods.items():
            log = self.cluster.kubectl(
                "-n", self.namespace, "logs", name, "-c", "harness", "--timestamps", check=False
            )
            for line in log.splitlines():
                stamp, _, text = line.partition(" ")
                if text.strip() == "answered":
                    times.answered = parse_time(stamp)
                    break


def parse_time(stamp: str) -> float:
    """An RFC 3339 timestamp with nanoseconds (the runtime's) as epoch seconds."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + (
        float("0." + frac) if frac else 0.0
    )


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (p99 of 50 values is the largest)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return round(ordered[rank - 1], 3)


def spans(pods: dict[str, PodTimes], start: str, end: str) -> list[float]:
    out = []
    for times in pods.values():
        a, b = getattr(times, start), getattr(times, end)
        if a is not None and b is not None:
            out.append(b - a)
    return out


def harness_env(name: str, hold: float) -> dict[str, Any]:
    return {
        "apiVersion": "openforge.dev/v1alpha1", "kind": "HarnessEnv", "metadata": {"name": name},
        "spec": {
            "api": "openai-chat",
            "baseUrl": {"env": ["OPENAI_BASE_URL"], "suffix": "/v1"},
            "template": {"spec": {"containers": [{
                "name": "harness", "image": IMAGE, "command": ["python3", "-c", CLIENT],
                "env": [{"name": "HOLD_SECONDS", "value": str(hold)}],
                "resources": HARNESS_RESOURCES,
            }]}},
            "timeoutSeconds": 600,
        },
    }  # fmt: skip


def rollout_job(name: str, count: int, parallelism: int) -> dict[str, Any]:
    return {
        "apiVersion": "openforge.dev/v1alpha1", "kind": "RolloutJob", "metadata": {"name": name},
        "spec": {
            "harnessEnvRef": {"name": name},
            "tasks": {"inline": [{"id": f"t{i}"} for i in range(count)]},
            "samplesPerTask": 1, "maxAttemptsPerRollout": 1, "parallelism": parallelism,
            "policy": {"endpoint": POLICY, "model": "tiny-react"},
            "trainer": {"endpoint": COLLECTOR},
        },
    }  # fmt: skip


def bare_job(name: str, count: int, parallelism: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed", "completions": count, "parallelism": parallelism,
            "backoffLimit": 0,
            "template": {"spec": {
                "restartPolicy": "Never", "enableServiceLinks": False,
                "automountServiceAccountToken": False,
                "containers": [{
                    "name": "harness", "image": IMAGE, "command": ["python3", "-c", CLIENT],
                    "env": [{"name": "OPENAI_BASE_URL", "value": f"{POLICY}/v1"},
                            {"name": "PROMPT_IDS", "value": json.dumps(BARE_PROMPT)}],
                    "resources": HARNESS_RESOURCES,
                }],
            }},
        },
    }  # fmt: skip


def fresh_namespace(cluster: Cluster, prefix: str) -> str:
    # the collector binds a job's name to its first RolloutJob
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    return name


def run_side(
    cluster: Cluster, kind: str, count: int, parallelism: int, *, timeout: float = 1800
) -> tuple[str, Watch, float, float]:
    """One RolloutJob (kind "operator") or Indexed Job ("job") run to its end: (namespace, watch,
    t0, t_end)."""
    namespace = fresh_namespace(cluster, f"bench-{kind}")
    watch = Watch(cluster, namespace)
    time.sleep(1)  # the watch is open before the first pod
    manifests = (
        [harness_env(namespace, 0), rollout_job(namespace, count, parallelism)]
        if kind == "operator"
        else [bare_job(namespace, count, parallelism)]
    )
    t0 = time.time()
    cluster.kubectl("-n", namespace, "apply", "-f", "-", stdin=yaml.safe_dump_all(manifests))
    deadline = time.monotonic() + timeout
    while not watch.done(count):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{namespace}: {sum(1 for t in watch.pods.values() if t.succeeded)} of {count} "
                f"pods succeeded in {timeout:.0f} s; failed: {watch.failed}"
            )
        if watch.failed:
            raise RuntimeError(f"{namespace}: pods failed: {watch.failed}")
        time.sleep(0.5)
    t_end = max(t.succeeded for t in watch.pods.values() if t.succeeded is not None)
    return namespace, watch, t0, t_end


def delete_namespace(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("delete", "namespace", namespace, "--wait=true", timeout=600, check=False)


def startup(cluster: Cluster, count: int, parallelism: int) -> dict[str, Any]:
    result: dict[str, Any] = {"rollouts": count, "parallelism": parallelism}
    for kind in ("operator", "job"):
        namespace, watch, t0, t_end = run_side(cluster, kind, count, parallelism)
        watch.stop()
        watch.fetch_answers()
        pods = watch.pods
        missing = [n for n, t in pods.items() if t.answered is None or t.scheduled is None]
        if missing:
            raise RuntimeError(f"{namespace}: no answer or schedule time for {missing}")
        side = {
            "pods": len(pods),
            "scheduled_to_answered": [
                percentile(spans(pods, "scheduled", "answered"), q) for q in (50, 99)
            ],
            "created_to_answered": [
                percentile(spans(pods, "created", "answered"), q) for q in (50, 99)
            ],
            "scheduled_to_harness_running": [
                percentile(spans(pods, "scheduled", "harness_running"), q) for q in (50, 99)
            ],
            "wall_s": round(t_end - t0, 1),
        }
        if kind == "operator":
            side["scheduled_to_sidecar_started"] = [
                percentile(spans(pods, "scheduled", "sidecar_started"), q) for q in (50, 99)
            ]
        result[kind] = side
        delete_namespace(cluster, namespace)
    op, job = result["operator"]["scheduled_to_answered"], result["job"]["scheduled_to_answered"]
    result["sidecar_adds_p50_s"] = round(op[0] - job[0], 3)
    result["ratio_p50"] = round(op[0] / job[0], 2)
    return result


def cgroup_memory(node: str, uid: str) -> dict[str, int]:
    """The sidecar container's memory cgroup (v1) of pod ``uid``, read inside its kind node:
    usage and peak (``max_usage_in_bytes``) in bytes, and the rss and page cache in them."""
    docker = shutil.which("docker") or "docker"

    def node_exec(*args: str) -> str:
        return subprocess.run(
            [docker, "exec", node, *args], capture_output=True, text=True, check=True, timeout=60
        ).stdout

    [cid] = node_exec(
        "crictl",
        "ps",
        "-q",
        "--state",
        "running",
        "--label",
        f"io.kubernetes.pod.uid={uid}",
        "--name",
        f"^{SIDECAR}$",
    ).split()
    # the kubelet's systemd driver nests the container as
    # .../kubelet-kubepods-...-pod<uid>.slice/cri-containerd-<id>.scope
    found = node_exec(
        "find", "/sys/fs/cgroup/memory", "-maxdepth", "6", "-type", "d", "-name", f"*{cid}*"
    ).split()
    if len(found) != 1:
        raise RuntimeError(f"{node}: memory cgroup of container {cid}: {found}")
    base = found[0]
    stat = dict(line.split() for line in node_exec("cat", f"{base}/memory.stat").splitlines())
    return {
        "usage": int(node_exec("cat", f"{base}/memory.usage_in_bytes")),
        "peak": int(node_exec("cat", f"{base}/memory.max_usage_in_bytes")),
        "rss": int(stat["total_rss"]),
        "cache": int(stat["total_cache"]),
    }


def memory(cluster: Cluster, count: int) -> dict[str, Any]:
    namespace = fresh_namespace(cluster, "bench-memory")
    watch = Watch(cluster, namespace)
    time.sleep(1)
    cluster.kubectl(
        "-n",
        namespace,
        "apply",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(
            [harness_env(namespace, 45), rollout_job(namespace, count, count)]
        ),
    )
    deadline = time.monotonic() + 600
    readings: list[dict[str, int]] = []
    seen: set[str] = set()
    while len(seen) < count and time.monotonic() < deadline:
        for name, times in list(watch.pods.items()):
            if name in seen or times.harness_running is None:
                continue
            log = cluster.kubectl("-n", namespace, "logs", name, "-c", "harness", check=False)
            if "answered" in log:
                readings.append(cgroup_memory(times.node, times.uid))
                seen.add(name)
        time.sleep(1)
    watch.stop()
    delete_namespace(cluster, namespace)
    if len(readings) < count:
        raise RuntimeError(f"memory: {len(readings)} of {count} sidecars read")
    mib = 1024 * 1024
    return {
        "pods": count,
        "usage_mib": [percentile([r["usage"] / mib for r in readings], q) for q in (50, 100)],
        "peak_mib": [percentile([r["peak"] / mib for r in readings], q) for q in (50, 100)],
        "rss_mib": [percentile([r["rss"] / mib for r in readings], q) for q in (50, 100)],
    }


def throughput(cluster: Cluster, count: int, parallelism: int) -> dict[str, Any]:
    result: dict[str, Any] = {"rollouts": count, "parallelism": parallelism}
    for kind in ("operator", "job"):
        namespace, watch, t0, t_end = run_side(cluster, kind, count, parallelism)
        watch.stop()
        names = {t.uid for t in watch.pods.values()}
        result[kind] = {
            "pods": len(names),
            "wall_s": round(t_end - t0, 1),
            "per_minute": round(count / (t_end - t0) * 60, 1),
        }
        delete_namespace(cluster, namespace)
    result["ratio"] = round(result["operator"]["per_minute"] / result["job"]["per_minute"], 2)
    return result


def platform_up(cluster: Cluster, sidecar_resources: str) -> None:
    subprocess.run(
        [cluster.helm, "--kubeconfig", cluster.kubeconfig,
         "upgrade", "--install", "openforge", str(CHART), "--namespace", "openforge",
         "--create-namespace", "-f", str(EXAMPLES / "helm" / "values.yaml"),
         "--set-json", f"operator.sidecarResources={sidecar_resources}",
         "--wait", "--timeout", "10m"],
        check=True, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    cluster.kubectl("create", "namespace", "rl", check=False)
    cluster.kubectl("-n", "rl", "apply", "-f", str(EXAMPLES / "policy.yaml"))
    cluster.kubectl(
        "-n", "rl", "rollout", "status", "deployment/policy", "--timeout=600s", timeout=660
    )


def tools() -> tuple[str, str]:
    """kubectl and helm as scripts/kind-up.sh finds them: $KUBECTL/$HELM, else the ones
    scripts/build_cluster_binaries.sh built, else PATH's."""
    check = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build_cluster_binaries.sh"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    built = dict(line.split("=", 1) for line in check.stdout.splitlines() if "=" in line)
    kubectl = os.environ.get("KUBECTL") or built.get("kubectl") or shutil.which("kubectl")
    helm = os.environ.get("HELM") or built.get("helm") or shutil.which("helm")
    if kubectl is None or helm is None:
        sys.exit("no kubectl or helm: run scripts/build_cluster_binaries.sh")
    return kubectl, helm


def row(name: str, values: list[Any]) -> str:
    return f"{name:<40}" + "".join(f"{'-' if v is None else v:>12}" for v in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rollouts", type=int, default=50, help="start-up: rollouts per side (default %(default)s)"
    )
    parser.add_argument(
        "--parallelism", type=int, default=10, help="start-up: pods at once (default %(default)s)"
    )
    parser.add_argument(
        "--memory-pods",
        type=int,
        default=5,
        help="sidecars whose memory is read (default %(default)s)",
    )
    parser.add_argument(
        "--throughput-rollouts",
        type=int,
        default=100,
        help="throughput: rollouts per side (default %(default)s)",
    )
    parser.add_argument(
        "--throughput-parallelism",
        type=int,
        nargs="*",
        default=[20, 50],
        help="throughput: parallelisms (default %(default)s)",
    )
    parser.add_argument(
        "--sidecar-resources",
        default=json.dumps(SIDECAR_RESOURCES),
        help="the operator's --sidecar-resources (default %(default)s)",
    )
    parser.add_argument("--kubeconfig", help="default: scripts/kind-up.sh kubeconfig")
    ns = parser.parse_args(argv)
    kubectl, helm = tools()
    kubeconfig = (
        ns.kubeconfig
        or subprocess.run(
            ["bash", str(KIND_UP), "kubeconfig"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    cluster = Cluster(kubeconfig, kubectl, helm)
    started = time.time()
    platform_up(cluster, ns.sidecar_resources)
    results: dict[str, Any] = {
        "machine": f"{platform.node()} {os.cpu_count()} CPUs",
        "sidecar_resources": json.loads(ns.sidecar_resources),
    }
    # each phase's figures as soon as it ends: a run cut short still tells
    results["startup"] = startup(cluster, ns.rollouts, ns.parallelism)
    print("startup:", json.dumps(results["startup"]), flush=True)
    results["memory"] = memory(cluster, ns.memory_pods)
    print("memory:", json.dumps(results["memory"]), flush=True)
    results["throughput"] = []
    for parallelism in ns.throughput_parallelism:
        results["throughput"].append(throughput(cluster, ns.throughput_rollouts, parallelism))
        print("throughput:", json.dumps(results["throughput"][-1]), flush=True)
    results["wall_s"] = round(time.time() - started, 1)

    s = results["startup"]
    print(
        f"start-up, {s['rollouts']} rollouts per side at parallelism {s['parallelism']} "
        "(seconds, p50 / p99)"
    )
    print(row("", ["op p50", "op p99", "job p50", "job p99"]))
    for key in ("scheduled_to_answered", "created_to_answered", "scheduled_to_harness_running"):
        print(row(key, [*s["operator"][key], *s["job"][key]]))
    print(
        row(
            "scheduled_to_sidecar_started",
            [*s["operator"]["scheduled_to_sidecar_started"], None, None],
        )
    )
    print(f"the sidecar adds {s['sidecar_adds_p50_s']} s at p50 (ratio {s['ratio_p50']})")
    m = results["memory"]
    print(
        f"sidecar memory over {m['pods']} pods (MiB, p50 / max): usage {m['usage_mib']}, peak "
        f"{m['peak_mib']}, rss {m['rss_mib']}"
    )
    for t in results["throughput"]:
        print(f"throughput at parallelism {t['parallelism']}:"
              f" operator {t['operator']['per_minute']}/min ({t['operator']['wall_s']} s),"
              f" Job {t['job']['per_minute']}/min ({t['job']['wall_s']} s),"
              f" ratio {t['ratio']}")  # fmt: skip
    print("--- json ---")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
