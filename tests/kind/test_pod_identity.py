"""Who a running rollout pod's containers are, read inside them (docs/operator.md, "The
rollout pod"), where the other tests only check the pod spec the operator builds:

* the harness runs as user 1000 (a member of the sidecar's group 1337, the default
  ``fsGroup``), with no capability, no new privileges, the runtime's seccomp filter and
  no service-account token; the sidecar-only volumes (the collector token, the job's
  CA key) are not there, and in Proxy mode the CA's certificate alone is; it has the
  rollout's ``OPENFORGE_*`` environment;
* the sidecar runs as user 1337 with no capability, no new privileges and seccomp, on a
  read-only root, as one process, and reads its token file: root-owned, mode 0440,
  group 1337 (the defect a real node first found: the sidecar could not read it);
* the pod carries the documented labels and annotations.

A stepped harness (``realpods.STEPPED``) waits after its first call, which keeps the
pod running while both containers are read; then it is let go and the job completes.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import kube_cluster
import pytest
import realpods

pytestmark = [pytest.mark.kind, pytest.mark.slow]

#: Printed inside a container: its first process's identity and confinement, the
#: processes it runs, its environment, and what a few paths are.
INSPECT = """
import json, os, stat, sys
status = {}
for line in open("/proc/1/status"):
    key, _, value = line.partition(":")
    if key in ("Uid", "Gid", "Groups", "CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp"):
        status[key] = value.split()
paths = {}
for path in sys.argv[1:]:
    try:
        info = os.stat(path)
    except OSError as error:
        paths[path] = {"error": error.errno}
        continue
    entry = {"uid": info.st_uid, "gid": info.st_gid, "mode": oct(stat.S_IMODE(info.st_mode))}
    if stat.S_ISREG(info.st_mode):
        try:
            entry["readable"] = bool(open(path, "rb").read())
        except OSError as error:
            entry["readable"] = error.errno
    paths[path] = entry
try:
    open("/openforge-probe", "w").close()
    root = "writable"
except OSError as error:
    root = error.errno
processes = sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid())
env = {k: v for k, v in os.environ.items() if k.startswith("OPENFORGE_")}
print(json.dumps({"status": status, "paths": paths, "root": root, "processes": processes,
                  "env": env}))
"""

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
EROFS, ENOENT = 30, 2


def inspect(
    kind: kube_cluster.Kube, namespace: str, pod: str, container: str, *paths: str
) -> dict[str, Any]:
    python = "python3" if container == "harness" else "python"
    out = kind.kubectl(
        "-n", namespace, "exec", pod, "-c", container, "--", python, "-c", INSPECT, *paths
    ).stdout
    found: dict[str, Any] = json.loads(out)
    return found


def no_capabilities(status: dict[str, list[str]]) -> bool:
    return all(int(status[key][0], 16) == 0 for key in ("CapEff", "CapPrm", "CapBnd"))


CA_KEY, CA_CERT = "/openforge/ca/mitmproxy-ca.pem", "/openforge/ca-cert/ca.crt"


def start_in_proxy_mode(kind: kube_cluster.Kube) -> str:
    """:func:`realpods.start`'s job, its harness calling a ``.test`` host through the
    sidecar as its HTTPS proxy (trusting the job's CA)."""
    name = f"ident-proxy-{uuid.uuid4().hex[:6]}"
    realpods.ensure_namespace(kind, name)
    env = realpods.stepped_env(name, 2)
    env["spec"]["capture"] = {"mode": "Proxy"}
    env["spec"].pop("baseUrl")
    harness = env["spec"]["template"]["spec"]["containers"][0]
    harness["env"].append({"name": "OPENAI_BASE_URL", "value": "https://llm.openforge.test/v1"})
    job = realpods.rollout_job(name, env=name, tasks=[{"id": "t0"}], rolloutTimeoutSeconds=900)
    realpods.apply(kind, name, env, job)
    return name


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["BaseURL", "Proxy"])
def test_a_running_rollout_pods_containers_are_who_the_docs_say(
    platform: kube_cluster.Kube, mode: str
) -> None:
    kind = platform
    if mode == "Proxy":
        name = start_in_proxy_mode(kind)
    else:
        name = realpods.start(kind, "ident", calls=2, rollouts=1)
    pod_name = f"{name}-0-0"
    realpods.wait_answered(kind, name, pod_name, 0)
    pod = realpods.pod(kind, name, pod_name)
    sidecar_spec = next(c for c in pod["spec"]["initContainers"] if c["name"] == realpods.SIDECAR)
    mounts = {m["name"]: m["mountPath"] for m in sidecar_spec["volumeMounts"]}
    token_dir = mounts["openforge-token"]
    token = f"{token_dir}/token"

    harness = inspect(kind, name, pod_name, "harness", token_dir, SERVICE_ACCOUNT, CA_KEY, CA_CERT)
    status = harness["status"]
    assert status["Uid"] == ["1000"] * 4, status
    assert "1337" in status["Groups"], status  # the pod's default fsGroup
    assert no_capabilities(status) and status["NoNewPrivs"] == ["1"], status
    assert status["Seccomp"] == ["2"], status  # a filter: RuntimeDefault
    paths = harness["paths"]
    assert paths[token_dir] == {"error": ENOENT}, paths  # the sidecar's alone
    assert paths[SERVICE_ACCOUNT] == {"error": ENOENT}, paths  # no service-account token
    assert paths[CA_KEY] == {"error": ENOENT}, paths  # the CA's key: the sidecar's alone
    if mode == "Proxy":  # the CA's certificate alone, to trust
        assert paths[CA_CERT]["readable"] is True, paths
    else:  # BaseURL: no CA at all
        assert paths[CA_CERT] == {"error": ENOENT}, paths
    assert harness["env"]["OPENFORGE_ROLLOUT_ID"] == pod_name, harness["env"]
    assert harness["env"]["OPENFORGE_JOB"] == name
    assert (harness["env"]["OPENFORGE_TASK_ID"], harness["env"]["OPENFORGE_ATTEMPT"]) == ("t0", "0")

    sidecar = inspect(kind, name, pod_name, realpods.SIDECAR, token, SERVICE_ACCOUNT, CA_KEY)
    status = sidecar["status"]
    assert status["Uid"] == ["1337"] * 4, status
    assert no_capabilities(status) and status["NoNewPrivs"] == ["1"], status
    assert status["Seccomp"] == ["2"], status
    assert sidecar["root"] == EROFS, sidecar["root"]  # a read-only root
    assert sidecar["processes"] == [1], sidecar["processes"]  # one process: podagent + sidecar
    file = sidecar["paths"][token]
    assert (file["uid"], file["gid"], file["mode"], file["readable"]) == (0, 1337, "0o440", True), (
        file
    )
    assert sidecar["paths"][SERVICE_ACCOUNT] == {"error": ENOENT}
    key = sidecar["paths"][CA_KEY]
    if mode == "Proxy":  # the job's CA key: as the token, readable through the group
        assert (key["uid"], key["gid"], key["mode"], key["readable"]) == (0, 1337, "0o440", True)
    else:
        assert key == {"error": ENOENT}, key

    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert labels["openforge.dev/job"] == name and labels["openforge.dev/rollout"] == "0", labels
    assert labels["openforge.dev/attempt"] == "0" and labels["openforge.dev/job-uid"], labels
    assert labels["app.kubernetes.io/managed-by"], labels
    assert annotations["openforge.dev/task-id"] == "t0", annotations
    assert annotations["openforge.dev/sample"] == "0", annotations
    assert "openforge.dev/policy-version" in annotations, annotations

    realpods.release(kind, name, pod_name, 1)
    done = realpods.wait_job(kind, name, name, timeout=400)
    assert realpods.condition(done, "Complete"), done["status"]
    made = realpods.delete_job_and_wait_collected(kind, name, name)
    if mode == "Proxy":  # the job's CA Secret goes with it
        assert f"secrets/{name}-ca" in made, made
    kind.kubectl("delete", "namespace", name, "--wait=false")
