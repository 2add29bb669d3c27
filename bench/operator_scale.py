"""The operator at scale against the built-in Job controller, side by side on the kwok cluster.

In one namespace of the simulated cluster (docs/cluster-testing.md) it creates,
at the same moment,

* a RolloutJob of ``--rollouts`` rollouts (``--rollouts / 4`` tasks x 4 samples)
  with ``--parallelism``, run by ``openforge operator`` (a subprocess, standalone,
  serving that namespace), and
* an Indexed ``batch/v1`` Job of as many completions, with the same parallelism,
  run by kube-controller-manager's Job controller,

whose pods kwok runs for ``--duration`` each (``openforge.dev/simulate-duration``)
and then completes. One watch on the namespace's pods times, per side, when the
last pod was created and when the last completed (from the moment both objects
were created), and counts duplicate pods (more than one pod for a rollout index,
or for a completion index). For the operator it reads its peak RSS (VmHWM) and
the CPU seconds it used during the run from /proc. Prints a table, the ratios
(operator / Job controller), then ``--- json ---`` and a JSON summary.

    python bench/operator_scale.py                      # 2,000 x 500 on a fresh local cluster
    python bench/operator_scale.py --rollouts 40 --parallelism 10 --kubeconfig $KUBECONFIG

With ``--kubeconfig`` (or ``$KUBECONFIG``) it uses that cluster, which must have
kwok nodes (the stages in scripts/cluster/kwok-stages); otherwise it starts one
with ``scripts/cluster.sh`` in a temporary folder and stops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openforge_operator import k8s

ROOT = Path(__file__).resolve().parents[1]
CRDS = [
    ROOT / "crds" / "openforge.dev_harnessenvs.yaml",
    ROOT / "crds" / "openforge.dev_rolloutjobs.yaml",
]
SAMPLES = 4
TIMEOUT_SECONDS = 900


@dataclass
class Side:
    """What the pod watch saw of one side's pods."""

    pods: dict[str, int] = field(default_factory=dict)  # pod name -> index
    created_at: dict[int, float] = field(default_factory=dict)  # index -> first pod seen
    succeeded_at: dict[int, float] = field(
        default_factory=dict
    )  # index -> first pod seen Succeeded

    def see(self, name: str, index: int, phase: str, now: float) -> None:
        self.pods.setdefault(name, index)
        self.created_at.setdefault(index, now)
        if phase == "Succeeded":
            self.succeeded_at.setdefault(index, now)

    def duplicates(self) -> int:
        return len(self.pods) - len(set(self.pods.values()))

    def result(self, total: int, t0: float) -> dict[str, Any]:
        created = sorted(self.created_at.values())
        done = sorted(self.succeeded_at.values())
        return {
            "pods": len(self.pods),
            "duplicates": self.duplicates(),
            "all_created_s": round(created[-1] - t0, 2) if len(created) >= total else None,
            "all_complete_s": round(done[-1] - t0, 2) if len(done) >= total else None,
        }


def classify(pod: dict[str, Any]) -> tuple[str, int] | None:
    """('rolloutjob' | 'job', index) of a pod, from the labels each controller sets."""
    labels = pod["metadata"].get("labels") or {}
    if "openforge.dev/rollout" in labels:
        return "rolloutjob", int(labels["openforge.dev/rollout"])
    if "batch.kubernetes.io/job-completion-index" in labels:
        return "job", int(labels["batch.kubernetes.io/job-completion-index"])
    return None


async def finished_status(
    api: Any, namespace: str, rollouts: int, timeout: float = 60.0
) -> dict[str, Any]:
    """The RolloutJob's status once its counts cover every rollout: the pods finish before
    the operator has seen them all, so a status read at once could lag them (it read 5 of
    8 succeeded on a busy machine)."""
    deadline = time.monotonic() + timeout
    while True:
        body = (
            await api.get(
                k8s.namespaced(
                    namespace, "rolloutjobs", name="scale", api_version="openforge.dev/v1alpha1"
                )
            )
            or {}
        )
        status: dict[str, Any] = body.get("status") or {}
        counts = status.get("counts") or {}
        if (
            counts.get("succeeded", 0) + counts.get("failed", 0) >= rollouts
            or time.monotonic() >= deadline
        ):
            return status
        await asyncio.sleep(0.2)


async def watch_pods(
    api: k8s.Api, namespace: str, sides: dict[str, Side], done: asyncio.Event, total: int
) -> None:
    """Record every pod of either side as the watch shows it; listed again if the watch expires."""
    path = k8s.pods_path(namespace)

    def see(pod: dict[str, Any]) -> None:
        kind = classify(pod)
        if kind is not None:
            phase = (pod.get("status") or {}).get("phase", "")
            sides[kind[0]].see(pod["metadata"]["name"], kind[1], phase, time.monotonic())
        if all(len(side.succeeded_at) >= total for side in sides.values()):
            done.set()

    while not done.is_set():
        items, version = await api.list(path, label_selector="")
        for pod in items:
            see(pod)
        with contextlib.suppress(k8s.ApiError):
            async for event in api.watch(path, label_selector="", resource_version=version):
                if event["type"] in ("ADDED", "MODIFIED"):
                    see(event["object"])
                if done.is_set():
                    return


def objects(
    name: str, rollouts: int, parallelism: int, duration: str
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    container = {"name": "harness", "image": "busybox:1.36", "command": ["sh", "-c", "exit 0"]}
    annotations = {"openforge.dev/simulate-duration": duration}
    env = {
        "apiVersion": "openforge.dev/v1alpha1", "kind": "HarnessEnv", "metadata": {"name": name},
        "spec": {"api": "openai-chat", "baseUrl": {"env": ["OPENAI_BASE_URL"]},
                 "template": {"metadata": {"annotations": annotations},
                              "spec": {"containers": [container]}}},
    }  # fmt: skip
    job = {
        "apiVersion": "openforge.dev/v1alpha1", "kind": "RolloutJob", "metadata": {"name": name},
        "spec": {
            "harnessEnvRef": {"name": name},
            "tasks": {"inline": [{"id": f"t{i}"} for i in range(rollouts // SAMPLES)]},
            "samplesPerTask": SAMPLES, "parallelism": parallelism,
            "policy": {"endpoint": "http://policy.bench.svc:8000", "model": "tiny"},
            "trainer": {"endpoint": "collector.bench.svc:50051"},
        },
    }  # fmt: skip
    batch = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{name}-indexed"},
        "spec": {
            "completionMode": "Indexed", "completions": rollouts, "parallelism": parallelism,
            "backoffLimit": 0,
            "template": {"metadata": {"annotations": annotations},
                         "spec": {"restartPolicy": "Never",
                                  "containers": [{**container, "name": "work"}]}},
        },
    }  # fmt: skip
    return env, job, batch


def proc_stats(pid: int) -> tuple[float, float]:
    """(CPU seconds used so far, peak RSS in MiB) of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    peak = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) / 1024
    return cpu, peak


@contextlib.contextmanager
def cluster(kubeconfig: str | None) -> Iterator[tuple[str, Path | None]]:
    """(kubeconfig, cluster folder or None): the given cluster, or a local one for the run."""
    if kubeconfig:
        yield kubeconfig, None
        return
    directory = Path(tempfile.mkdtemp(prefix="openforge-bench-"))
    up = subprocess.run(
        ["bash", str(ROOT / "scripts" / "cluster.sh"), "up", "--dir", str(directory)],
        capture_output=True,
        text=True,
        check=False,
    )
    if up.returncode != 0:
        raise SystemExit(f"scripts/cluster.sh up failed:\n{up.stderr[-3000:]}")
    try:
        yield up.stdout.strip().splitlines()[-1], directory
    finally:
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "cluster.sh"), "down", "--dir", str(directory)],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(directory, ignore_errors=True)


def kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> str:
    binary = os.environ.get("KUBECTL") or _built_kubectl()
    done = subprocess.run(
        [binary, "--kubeconfig", kubeconfig, *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _built_kubectl() -> str:
    check = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build_cluster_binaries.sh"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = check.stdout.strip().splitlines()
    return str(Path(lines[-1]) / "kubectl") if check.returncode == 0 and lines else "kubectl"


async def run(
    kubeconfig: str, *, rollouts: int, parallelism: int, duration: str, log: Path
) -> dict[str, Any]:
    for path in CRDS:
        kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(path))
    kubectl(
        kubeconfig,
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/harnessenvs.openforge.dev",
        "crd/rolloutjobs.openforge.dev",
    )
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    kubectl(kubeconfig, "create", "namespace", namespace)
    env, job, batch = objects("scale", rollouts, parallelism, duration)
    operator = subprocess.Popen(
        [sys.executable, "-m", "openforge.cli", "operator", "--namespace", namespace,
         "--standalone", "--kubeconfig", kubeconfig],
        stdout=log.open("wb"), stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    api = await k8s.Api.connect(kubeconfig)
    try:
        await _wait_for_service_account(api, namespace)
        await api.create(
            k8s.namespaced(namespace, "harnessenvs", api_version="openforge.dev/v1alpha1"), env
        )
        await _wait_ready(api, namespace, operator, log)
        sides = {"rolloutjob": Side(), "job": Side()}
        done = asyncio.Event()
        watcher = asyncio.create_task(watch_pods(api, namespace, sides, done, rollouts))
        await asyncio.sleep(1.0)  # the watch is open
        cpu0, _ = proc_stats(operator.pid)
        t0 = time.monotonic()
        await asyncio.gather(
            api.create(
                k8s.namespaced(namespace, "rolloutjobs", api_version="openforge.dev/v1alpha1"), job
            ),
            api.create(k8s.namespaced(namespace, "jobs", api_version="batch/v1"), batch),
        )
        try:
            await asyncio.wait_for(done.wait(), timeout=TIMEOUT_SECONDS)
        except TimeoutError:
            print(f"timed out after {TIMEOUT_SECONDS} s; operator log: {log}", file=sys.stderr)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        cpu1, peak = proc_stats(operator.pid)
        status = await finished_status(api, namespace, rollouts)
        ours, theirs = sides["rolloutjob"].result(rollouts, t0), sides["job"].result(rollouts, t0)
        ours.update(
            {
                "operator_cpu_s": round(cpu1 - cpu0, 2),
                "operator_peak_rss_mib": round(peak, 1),
                "status_counts": status.get("counts"),
            }
        )
        return {
            "rollouts": rollouts, "parallelism": parallelism, "duration": duration,
            "rolloutjob": ours, "job": theirs,
            "ratio_all_created": _ratio(ours["all_created_s"], theirs["all_created_s"]),
            "ratio_all_complete": _ratio(ours["all_complete_s"], theirs["all_complete_s"]),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "load_average": [round(x, 2) for x in os.getloadavg()]},
        }  # fmt: skip
    finally:
        operator.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            operator.wait(timeout=20)
        if operator.poll() is None:
            operator.kill()
        with contextlib.suppress(k8s.ApiError):
            await api.delete(f"/api/v1/namespaces/{namespace}")
        await api.close()


async def _wait_for_service_account(api: k8s.Api, namespace: str) -> None:
    for _ in range(600):
        if await api.get(k8s.namespaced(namespace, "serviceaccounts", name="default")) is not None:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"no default service account in {namespace}")


async def _wait_ready(
    api: k8s.Api, namespace: str, operator: subprocess.Popen[bytes], log: Path
) -> None:
    """The operator is up once it has set the HarnessEnv's Ready condition."""
    path = k8s.namespaced(
        namespace, "harnessenvs", name="scale", api_version="openforge.dev/v1alpha1"
    )
    for _ in range(1200):
        if operator.poll() is not None:
            raise RuntimeError(
                f"the operator exited with {operator.returncode}:\n{log.read_text()[-3000:]}"
            )
        body = await api.get(path) or {}
        if any(c.get("type") == "Ready" for c in (body.get("status") or {}).get("conditions", [])):
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"the operator did not mark the HarnessEnv Ready; log: {log}")


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return round(ours / theirs, 3) if ours is not None and theirs else None


def table(result: dict[str, Any]) -> str:
    ours, theirs = result["rolloutjob"], result["job"]
    rows = [
        ("pods", ours["pods"], theirs["pods"], ""),
        ("duplicate pods", ours["duplicates"], theirs["duplicates"], ""),
        (
            "all pods created (s)",
            ours["all_created_s"],
            theirs["all_created_s"],
            result["ratio_all_created"],
        ),
        (
            "all pods complete (s)",
            ours["all_complete_s"],
            theirs["all_complete_s"],
            result["ratio_all_complete"],
        ),
        ("operator CPU during the run (s)", ours["operator_cpu_s"], "", ""),
        ("operator peak RSS (MiB)", ours["operator_peak_rss_mib"], "", ""),
    ]
    head = (
        f"{result['rollouts']} rollouts, parallelism {result['parallelism']}, "
        f"{result['duration']} per pod"
    )
    lines = [head, f"{'':34}{'RolloutJob':>12}{'Indexed Job':>13}{'ratio':>8}"]
    lines += [f"{name:34}{a!s:>12}{b!s:>13}{c!s:>8}" for name, a, b, c in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rollouts", type=int, default=2000, help="rollouts and Job completions (a multiple of 4)"
    )
    parser.add_argument("--parallelism", type=int, default=500)
    parser.add_argument(
        "--duration", default="1s", help="how long each pod runs under kwok (Go duration)"
    )
    parser.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="an existing kwok cluster (default: start one)",
    )
    args = parser.parse_args(argv)
    if args.rollouts % SAMPLES or args.rollouts <= 0:
        parser.error(f"--rollouts must be a positive multiple of {SAMPLES}")
    with cluster(args.kubeconfig) as (kubeconfig, _), tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "operator.log"
        result = asyncio.run(
            run(
                kubeconfig,
                rollouts=args.rollouts,
                parallelism=args.parallelism,
                duration=args.duration,
                log=log,
            )
        )
    print(table(result))
    print("--- json ---")
    print(json.dumps(result, indent=2))
    complete = (
        result["rolloutjob"]["all_complete_s"] is not None
        and result["job"]["all_complete_s"] is not None
    )
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
