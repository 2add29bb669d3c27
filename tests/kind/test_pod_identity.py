"""Who a running rollout pod's containers are, read inside them (docs/operator.md, "The
rollout pod"), where the other tests only check the pod spec the operator builds:

* the harness runs as user 1000 (a member of the sidecar's group 1337, the default
  ``fsGroup``), with no capability, no new privileges, the runtime's seccomp filter and
  no service-account token; the sidecar-only volumes (the collector token, the job's
  CA key) are not there, and in Proxy mode the CA's certificate alone is; it has the
  rollout's ``OPENFORGE_*`` environment and no service links (a Service made in the
  namespace before the pod gives it no ``*_SERVICE_HOST``);
* in Proxy and Transparent modes the certificate the harness trusts is its job's own:
  the one in its job's CA Secret, not the one a second job beside it got;
* the sidecar runs as user 1337 with no capability, no new privileges and seccomp, on a
  read-only root, as one process, and reads its token file: root-owned, mode 0440,
  group 1337 (the defect a real node first found: the sidecar could not read it);
* the pod carries the documented labels and annotations;
* in Transparent mode, the ``openforge-redirect`` init container ran as root with
  ``NET_ADMIN`` and ``NET_RAW`` alone and left, in the pod's network namespace (read
  from the node), the nat rules the docs list: outbound TCP to the sidecar's port,
  except the sidecar's user, loopback, DNS and the collector's Service address.

A stepped harness (``realpods.STEPPED``) waits after its first call, which keeps the
pod running while both containers are read; then it is let go and the job completes.
"""

from __future__ import annotations

import base64
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
services = sorted(k for k in os.environ if k.endswith("_SERVICE_HOST"))
print(json.dumps({"status": status, "paths": paths, "root": root, "processes": processes,
                  "env": env, "services": services}))
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


ENDPOINTS = {
    # a host only the sidecar, as the harness's HTTPS proxy, can answer
    "Proxy": "https://llm.openforge.test/v1",
    # the policy Service itself, over HTTPS: the redirect hands the connection to the sidecar
    "Transparent": "https://policy.rl.svc:8000/v1",
}


NEIGHBOUR = "neighbour"
"""A Service in each job's namespace, made before its pods: with service links on, the
kubelet would give every container ``NEIGHBOUR_SERVICE_HOST`` and friends."""


def start_job(kind: kube_cluster.Kube, mode: str) -> str:
    """A namespace with a Service (:data:`NEIGHBOUR`) and a one-rollout stepped job in
    ``mode``; in Proxy and Transparent modes the harness calls :data:`ENDPOINTS` over
    HTTPS (trusting the job's CA), and a second job (``<name>-twin``) of the same
    HarnessEnv runs beside it, with its own CA."""
    name = f"ident-{mode.lower()[:5]}-{uuid.uuid4().hex[:6]}"
    realpods.ensure_namespace(kind, name)
    kind.kubectl("-n", name, "create", "service", "clusterip", NEIGHBOUR, "--tcp=80:80")
    env = realpods.stepped_env(name, 2)
    jobs = [name]
    if mode != "BaseURL":
        env["spec"]["capture"] = {"mode": mode}
        env["spec"].pop("baseUrl")
        harness = env["spec"]["template"]["spec"]["containers"][0]
        harness["env"].append({"name": "OPENAI_BASE_URL", "value": ENDPOINTS[mode]})
        jobs.append(f"{name}-twin")
    realpods.apply(kind, name, env, *(
        realpods.rollout_job(job, env=name, tasks=[{"id": "t0"}], rolloutTimeoutSeconds=900)
        for job in jobs
    ))  # fmt: skip
    return name


def service_links_of_a_plain_pod(kind: kube_cluster.Kube, namespace: str) -> list[str]:
    """The ``*_SERVICE_HOST`` variables a pod no job made gets in ``namespace``."""
    show = "import os; print(sorted(k for k in os.environ if k.endswith('_SERVICE_HOST')))"
    kind.kubectl("-n", namespace, "run", "links", f"--image={realpods.HARNESS_IMAGE}",
                 "--image-pull-policy=IfNotPresent", "--restart=Never",
                 "--command", "--", "python3", "-c", show)  # fmt: skip
    kube_cluster.wait_for(
        lambda: realpods.pod(kind, namespace, "links")["status"].get("phase") == "Succeeded",
        what="the plain pod done",
        timeout=180,
        interval=1,
    )
    printed = kind.kubectl("-n", namespace, "logs", "links").stdout.strip()
    links: list[str] = json.loads(printed.replace("'", '"'))
    return links


def ca_of(kind: kube_cluster.Kube, namespace: str, job: str) -> tuple[str, str]:
    """The CA certificate the harness of ``job``'s first pod trusts, and the one in the
    job's CA Secret."""
    trusted = kind.kubectl(
        "-n", namespace, "exec", f"{job}-0-0", "-c", "harness", "--", "cat", CA_CERT
    ).stdout
    secret = kind.get_json("-n", namespace, "secret", f"{job}-ca")["data"]["ca.crt"]
    return trusted, base64.b64decode(secret).decode()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["BaseURL", "Proxy", "Transparent"])
def test_a_running_rollout_pods_containers_are_who_the_docs_say(
    platform: kube_cluster.Kube, mode: str
) -> None:
    kind = platform
    name = start_job(kind, mode)
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
    if mode != "BaseURL":  # the CA's certificate alone, to trust
        assert paths[CA_CERT]["readable"] is True, paths
    else:  # BaseURL: no CA at all
        assert paths[CA_CERT] == {"error": ENOENT}, paths
    assert harness["env"]["OPENFORGE_ROLLOUT_ID"] == pod_name, harness["env"]
    assert harness["env"]["OPENFORGE_JOB"] == name
    assert (harness["env"]["OPENFORGE_TASK_ID"], harness["env"]["OPENFORGE_ATTEMPT"]) == ("t0", "0")
    assert harness["env"]["OPENFORGE_SAMPLE_INDEX"] == "0", harness["env"]
    assert harness["env"]["OPENFORGE_WORKDIR"], harness["env"]
    # no service links: the API server's address alone, which every pod gets
    assert harness["services"] == ["KUBERNETES_SERVICE_HOST"], harness["services"]
    if mode == "BaseURL":  # the control: a plain pod in the same namespace gets the links
        assert service_links_of_a_plain_pod(kind, name) == [
            "KUBERNETES_SERVICE_HOST", f"{NEIGHBOUR.upper()}_SERVICE_HOST"
        ]  # fmt: skip

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
    if mode != "BaseURL":  # the job's CA key: as the token, readable through the group
        assert (key["uid"], key["gid"], key["mode"], key["readable"]) == (0, 1337, "0o440", True)
    else:
        assert key == {"error": ENOENT}, key

    init = [c["name"] for c in pod["spec"]["initContainers"]]
    if mode == "Transparent":
        assert init[0] == "openforge-redirect", init
        check_redirect(kind, pod)
    else:
        assert "openforge-redirect" not in init, init

    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert labels["openforge.dev/job"] == name and labels["openforge.dev/rollout"] == "0", labels
    assert labels["openforge.dev/attempt"] == "0" and labels["openforge.dev/job-uid"], labels
    assert labels["app.kubernetes.io/managed-by"], labels
    assert annotations["openforge.dev/task-id"] == "t0", annotations
    assert annotations["openforge.dev/sample"] == "0", annotations
    assert "openforge.dev/policy-version" in annotations, annotations

    if mode != "BaseURL":  # each job its own CA: the harness trusts its job's, not another's
        twin = f"{name}-twin"
        realpods.wait_answered(kind, name, f"{twin}-0-0", 0)
        trusted, issued = ca_of(kind, name, name)
        twin_trusted, twin_issued = ca_of(kind, name, twin)
        assert trusted == issued and twin_trusted == twin_issued, (trusted, issued)
        assert "BEGIN CERTIFICATE" in trusted and trusted != twin_trusted, (trusted, twin_trusted)
        realpods.release(kind, name, f"{twin}-0-0", 1)

    realpods.release(kind, name, pod_name, 1)
    done = realpods.wait_job(kind, name, name, timeout=400)
    assert realpods.condition(done, "Complete"), done["status"]
    made = realpods.delete_job_and_wait_collected(kind, name, name)
    if mode != "BaseURL":  # the job's CA Secret goes with it
        assert f"secrets/{name}-ca" in made, made
    kind.kubectl("delete", "namespace", name, "--wait=false")


def check_redirect(kind: kube_cluster.Kube, pod: dict[str, Any]) -> None:
    """The Transparent init container's confinement, and the nat rules it left in the pod's
    network namespace (entered from the node through the sidecar's process)."""
    spec = pod["spec"]["initContainers"][0]
    assert spec["securityContext"]["runAsUser"] == 0, spec["securityContext"]
    assert spec["securityContext"]["capabilities"] == {
        "add": ["NET_ADMIN", "NET_RAW"],
        "drop": ["ALL"],
    }, spec["securityContext"]
    state = realpods.container_status(pod, "openforge-redirect")["state"]
    assert state["terminated"]["exitCode"] == 0, state
    node, uid = pod["spec"]["nodeName"], pod["metadata"]["uid"]
    [sidecar_id] = realpods.node_exec(
        node, "crictl", "ps", "-q", "--state", "running",
        "--label", f"io.kubernetes.pod.uid={uid}", "--name", f"^{realpods.SIDECAR}$",
    ).split()  # fmt: skip
    pid = json.loads(realpods.node_exec(node, "crictl", "inspect", sidecar_id))["info"]["pid"]
    rules = realpods.node_exec(
        node, "nsenter", "-t", str(pid), "-n", "iptables-nft-save", "-t", "nat"
    ).splitlines()
    chain = [line for line in rules if line.startswith("-A OPENFORGE_OUTPUT")]
    collector = kind.get_json("-n", "openforge", "service", "openforge-collector")["spec"][
        "clusterIP"
    ]
    assert "-A OUTPUT -p tcp -j OPENFORGE_OUTPUT" in rules, rules
    assert chain == [
        "-A OPENFORGE_OUTPUT -m owner --uid-owner 1337 -j RETURN",
        "-A OPENFORGE_OUTPUT -d 127.0.0.0/8 -j RETURN",
        "-A OPENFORGE_OUTPUT -p tcp -m tcp --dport 53 -j RETURN",
        f"-A OPENFORGE_OUTPUT -d {collector}/32 -j RETURN",
        "-A OPENFORGE_OUTPUT -p tcp -j REDIRECT --to-ports 15090",
    ], chain
