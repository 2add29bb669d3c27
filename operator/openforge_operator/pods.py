"""The rollout pod: one attempt of one rollout, built from the job, its HarnessEnv and settings
(pure).

Anatomy of ``<job>-<index>-<attempt>``:

- ``initContainers``: in Transparent mode first ``openforge-redirect``
  (iptables, the only container with a capability: NET_ADMIN), then the
  capture sidecar ``openforge-sidecar`` as a native sidecar
  (``restartPolicy: Always``), then the template's own init containers. The
  harness container starts beside the sidecar and its entrypoint waits for the
  sidecar's ``sidecar-ready`` file before it runs the harness; a pod with
  containers of the template's own (init or not) gets instead an ``exec``
  ``startupProbe`` inside the sidecar, connecting to its loopback port, which
  holds every later container back until it listens. Either way the harness
  starts only once the pod is fenced: the agent makes ``sidecar-ready`` when
  its try of the API server fails, i.e. the job's NetworkPolicy is enforced
  (``--fence-wait-seconds``; Kubernetes lets a pod start before its policy).
- ``containers``: the template's, the ``harness`` container's command wrapped
  by :mod:`openforge_operator.entrypoint` (harness, then grader, then report),
  its env carrying the task and pointing it at the sidecar.
- ``volumes``: ``openforge-run`` (shared by harness and sidecar: the harness's
  exit code, the grader's output, the verdict), ``openforge-sidecar`` (the
  sidecar's spool and confdir), the job's CA (key for the sidecar, certificate
  alone for the harness), the collector token (sidecar only: the job's
  ``tokenSecretRef``, else the token the operator issued it), the task file.
- ``restartPolicy: Never``, ``activeDeadlineSeconds`` from the rollout timeout,
  no service-account token, non-root with every capability dropped, ``fsGroup``
  the sidecar's group (unless the template sets one) so the sidecar can read its
  0440 Secret files.
"""

from __future__ import annotations

import copy
import dataclasses
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from openforge import control, podrun
from openforge.api import retries, rollout_env, rollouts, templates, v1alpha1

from openforge_operator import attempts, entrypoint, objects, probe, settings, tasks, tokens

SIDECAR = "openforge-sidecar"
REDIRECT = "openforge-redirect"
RUN_VOLUME = "openforge-run"
SIDECAR_VOLUME = "openforge-sidecar"
CA_VOLUME = "openforge-ca"
CA_CERT_VOLUME = "openforge-ca-cert"
TOKEN_VOLUME = "openforge-token"
TASK_VOLUME = "openforge-task"

SIDECAR_DIR = "/openforge/sidecar"
CONTROL_TOKEN = posixpath.join(SIDECAR_DIR, control.FILENAME)
"""The sidecar's control token (``openforge.control``), in its own volume: the harness
container does not mount it, so only the in-pod agent can report the rollout."""
CA_DIR = "/openforge/ca"
CA_CERT_DIR = "/openforge/ca-cert"
TOKEN_DIR = "/openforge/token"
CA_KEY = "mitmproxy-ca.pem"
"""Secret key of the CA's private key and certificate (mitmproxy's confdir file)."""
CA_CERT = "ca.crt"
"""Secret key of the CA certificate alone (what the harness trusts)."""
TOKEN_FILE = "token"
TASK_ITEM = "task"

CA_TRUST_ENV = (
    "SSL_CERT_FILE",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
)
"""Env vars that make OpenSSL, Node, requests/httpx, curl and git trust the job's CA."""
PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
NO_PROXY_ENV = ("NO_PROXY", "no_proxy")

AGENT_COMMAND = ["python", "-m", "openforge_sidecar.podagent"]
SIDECAR_START_SECONDS = 120
"""How long the harness (or, with a startup probe, the kubelet) waits for the sidecar to listen."""
SIDECAR_COMMAND = ["python", "-m", "openforge.cli", "sidecar"]
MODES = {"BaseURL": "reverse", "Proxy": "regular", "Transparent": "transparent"}
"""Capture mode -> the sidecar's network mode."""

REDIRECT_SCRIPT = r"""set -eu
iptables -t nat -N OPENFORGE_OUTPUT
iptables -t nat -A OUTPUT -p tcp -j OPENFORGE_OUTPUT
iptables -t nat -A OPENFORGE_OUTPUT -m owner --uid-owner "$OPENFORGE_SIDECAR_UID" -j RETURN
iptables -t nat -A OPENFORGE_OUTPUT -d 127.0.0.0/8 -j RETURN
iptables -t nat -A OPENFORGE_OUTPUT -p tcp --dport 53 -j RETURN
for host in $OPENFORGE_REDIRECT_EXCLUDE; do
  iptables -t nat -A OPENFORGE_OUTPUT -d "$host" -j RETURN ||
    echo "openforge-redirect: cannot exclude $host" >&2
done
iptables -t nat -A OPENFORGE_OUTPUT -p tcp -j REDIRECT --to-ports "$OPENFORGE_SIDECAR_PORT"
"""
"""Redirect the pod's outbound TCP to the sidecar, except the sidecar's own traffic
(by user id), loopback, DNS and the collector; IPv4 only."""


class PodError(ValueError):
    """A HarnessEnv or job that cannot make a pod; the message names the field."""


def rollout_timeout(
    job: v1alpha1.RolloutJob, env: v1alpha1.HarnessEnv, *, config: settings.Settings
) -> int:
    """Seconds one attempt's harness may run: the job's, else the HarnessEnv's, else the default."""
    return (
        job.spec.rollout_timeout_seconds
        or env.spec.timeout_seconds
        or config.default_rollout_timeout_seconds
    )


def deadline_seconds(
    job: v1alpha1.RolloutJob, env: v1alpha1.HarnessEnv, *, config: settings.Settings
) -> int:
    """The pod's ``activeDeadlineSeconds``: harness, grader, the collector's ack, start-up slack."""
    grader = env.spec.grader.timeout_seconds if env.spec.grader is not None else 0
    return (
        rollout_timeout(job, env, config=config)
        + grader
        + config.finish_wait_seconds
        + config.pod_deadline_slack_seconds
    )


def failing_exit_codes(job: v1alpha1.RolloutJob) -> str:
    """Harness exit codes that fail an attempt (``retries.failing_exit_codes``, the rule
    ``openforge run`` judges by too), compact, for the in-pod agent's flag."""
    return rollouts.format_indexes(retries.failing_exit_codes(job.spec))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PodInputs:
    """What one rollout pod is built from."""

    job: v1alpha1.RolloutJob
    env: v1alpha1.HarnessEnv
    rollout: tasks.Rollout
    attempt: int
    config: settings.Settings
    earlier: tuple[retries.Tried, ...] = ()

    @property
    def name(self) -> str:
        """The pod's name, which is also the rollout id its records carry."""
        return objects.pod_name(
            objects.job_name(self.job), self.rollout.index, attempt=self.attempt
        )


def build_pod(
    *,
    job: v1alpha1.RolloutJob,
    env: v1alpha1.HarnessEnv,
    rollout: tasks.Rollout,
    attempt: int,
    config: settings.Settings,
    earlier: Sequence[retries.Tried] = (),
) -> dict[str, Any]:
    """The pod of attempt ``attempt`` of ``rollout``, after the failed attempts ``earlier``;
    raises PodError naming a field it cannot use."""
    if job.spec.policy.endpoint is None:
        raise PodError("spec.policy.endpoint is required in a cluster")
    inputs = PodInputs(
        job=job, env=env, rollout=rollout, attempt=attempt, config=config, earlier=tuple(earlier)
    )
    template = env.spec.template.to_dict()
    spec: dict[str, Any] = copy.deepcopy(template["spec"])
    containers = spec["containers"]
    position = next(i for i, c in enumerate(containers) if c["name"] == v1alpha1.HARNESS_CONTAINER)
    pod_security = template["spec"].get("securityContext") or {}
    containers[position] = _harness(inputs, containers[position], pod_security=pod_security)
    for i, container in enumerate(containers):
        if i != position:
            containers[i] = _hardened(container)
    init = [_hardened(c) for c in spec.get("initContainers", [])]
    # The harness waits for the sidecar itself (its entrypoint); containers of the
    # template's own are held back by a startup probe, as in an injected pod.
    probed = bool(init) or len(containers) > 1
    sidecar = _sidecar(inputs, startup_probe=probed)
    spec["initContainers"] = [*_redirect(job, env, config=config), sidecar, *init]
    spec["volumes"] = [*spec.get("volumes", []), *_volumes(job, env, config=config)]
    if env.spec.task.file is not None:
        spec["volumes"].append(task_volume(job, rollout))
    spec["restartPolicy"] = "Never"
    spec["activeDeadlineSeconds"] = deadline_seconds(job, env, config=config)
    spec["automountServiceAccountToken"] = False
    spec.setdefault("enableServiceLinks", False)
    security = spec.setdefault("securityContext", {})
    security.setdefault("runAsNonRoot", True)
    security.setdefault("seccompProfile", {"type": "RuntimeDefault"})
    sidecar_can_read_secrets(security, config)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(inputs, template.get("metadata") or {}),
        "spec": spec,
    }


def _metadata(inputs: PodInputs, template: Mapping[str, Any]) -> dict[str, Any]:
    job, rollout, attempt = inputs.job, inputs.rollout, inputs.attempt
    meta = objects.metadata(job, inputs.name)
    meta["labels"] = {
        **(template.get("labels") or {}),
        **meta["labels"],
        objects.LABEL_ROLLOUT: str(rollout.index),
        objects.LABEL_ATTEMPT: str(attempt),
    }
    meta["annotations"] = {
        **(template.get("annotations") or {}),
        objects.ANNOTATION_TASK_ID: rollout.task_id,
        objects.ANNOTATION_SAMPLE: str(rollout.sample),
        objects.ANNOTATION_POLICY_VERSION: str(job.spec.policy.version),
    }
    if inputs.earlier:
        meta["annotations"][objects.ANNOTATION_EARLIER] = attempts.earlier_annotation(
            inputs.earlier
        )
    meta["finalizers"] = [objects.POD_FINALIZER]
    return meta


def _harness(
    inputs: PodInputs, container: dict[str, Any], *, pod_security: Mapping[str, Any]
) -> dict[str, Any]:
    env, rollout, config = inputs.env, inputs.rollout, inputs.config
    spec = env.spec
    where = (
        f"HarnessEnv {env.metadata.name}: spec.template.spec."
        f"containers[{v1alpha1.HARNESS_CONTAINER}]"
    )
    if not container.get("command"):
        raise PodError(
            f"{where}.command is required in a cluster (the operator runs it under its entrypoint)"
        )
    if not container.get("image"):
        raise PodError(f"{where}.image is required in a cluster")
    workdir = container.get("workingDir")
    base = _base_env(inputs, workdir=workdir)
    argv = [*container["command"], *container.get("args", [])]
    try:
        argv += [templates.render(arg, rollout.task) for arg in spec.task.args or []]
        task_env = {k: templates.render(v, rollout.task) for k, v in (spec.task.env or {}).items()}
    except templates.TemplateError as error:
        raise PodError(f"HarnessEnv {env.metadata.name}: spec.task: {error}") from None
    grader = (
        _expanded(
            spec.grader.command, base, where=f"HarnessEnv {env.metadata.name}: spec.grader.command"
        )
        if spec.grader is not None
        else None
    )
    harness = {**container}
    harness["command"] = entrypoint.COMMAND
    harness["args"] = entrypoint.arguments(
        _expanded(argv, base, where=f"{where}.command/args, spec.task.args"), grader
    )
    harness["env"] = _merge_env(
        [{"name": k, "value": v} for k, v in base.items()],
        container.get("env", []),
        [{"name": k, "value": v} for k, v in task_env.items()],
        [{"name": k, "value": v} for k, v in _capture_env(env, config).items()],
    )
    mounts: list[dict[str, Any]] = [
        *container.get("volumeMounts", []),
        {"name": RUN_VOLUME, "mountPath": podrun.RUN_DIR},
    ]
    if spec.capture.mode != "BaseURL":
        mounts.append({"name": CA_CERT_VOLUME, "mountPath": CA_CERT_DIR, "readOnly": True})
    if spec.task.file is not None:
        mounts.append(
            {
                "name": TASK_VOLUME,
                "mountPath": _task_path(env, workdir),
                "subPath": TASK_ITEM,
                "readOnly": True,
            }
        )
    harness["volumeMounts"] = mounts
    harness["securityContext"] = _harness_security(container, pod_security, config=config)
    return harness


def _base_env(inputs: PodInputs, *, workdir: str | None) -> dict[str, str]:
    """What every harness and grader sees about its rollout (``rollout_env.base_env``, as
    ``openforge run`` gives it too), and what only a pod has: its run folder and waits."""
    grader, rollout, config = inputs.env.spec.grader, inputs.rollout, inputs.config
    return {
        **rollout_env.base_env(
            job=objects.job_name(inputs.job),
            rollout_id=inputs.name,
            task=rollout.task,
            sample=rollout.sample,
            attempt=inputs.attempt,
            workdir=workdir or ".",
        ),
        "OPENFORGE_RUN_DIR": podrun.RUN_DIR,
        "OPENFORGE_FINISH_WAIT": str(config.finish_wait_seconds + 30),
        "OPENFORGE_SIDECAR_WAIT": str(SIDECAR_START_SECONDS),
        "OPENFORGE_GRADER_TIMEOUT": str(grader.timeout_seconds if grader is not None else 0),
    }


def _capture_env(env: v1alpha1.HarnessEnv, config: settings.Settings) -> dict[str, str]:
    """How the harness's model traffic reaches the sidecar."""
    address = f"http://127.0.0.1:{config.sidecar_port}"
    mode = env.spec.capture.mode
    values: dict[str, str] = {}
    if env.spec.base_url is not None:
        values.update({var: address + env.spec.base_url.suffix for var in env.spec.base_url.env})
    if mode == "Proxy":
        values.update({var: address for var in PROXY_ENV})
        values.update({var: "127.0.0.1,localhost" for var in NO_PROXY_ENV})
    if mode != "BaseURL":
        values.update({var: posixpath.join(CA_CERT_DIR, CA_CERT) for var in CA_TRUST_ENV})
    return values


def _sidecar(inputs: PodInputs, *, startup_probe: bool) -> dict[str, Any]:
    job, env, rollout, config, name = (
        inputs.job,
        inputs.env,
        inputs.rollout,
        inputs.config,
        inputs.name,
    )
    listen = f"127.0.0.1:{config.sidecar_port}"
    confdir = posixpath.join(SIDECAR_DIR, "confdir")
    grader = env.spec.grader
    agent = [
        "--listen", listen,
        "--reward-from", grader.reward_from if grader is not None else "none",
        "--failing-exit-codes", failing_exit_codes(job),
        "--finish-wait", str(config.finish_wait_seconds),
        "--control-token-file", CONTROL_TOKEN,
    ]  # fmt: skip
    if config.fence_wait_seconds > 0:
        agent += ["--fence-wait", str(config.fence_wait_seconds)]
    mounts: list[dict[str, Any]] = [
        {"name": RUN_VOLUME, "mountPath": podrun.RUN_DIR},
        {"name": SIDECAR_VOLUME, "mountPath": SIDECAR_DIR},
    ]
    if env.spec.capture.mode != "BaseURL":
        agent += ["--ca-file", posixpath.join(CA_DIR, CA_KEY), "--confdir", confdir]
        mounts.append({"name": CA_VOLUME, "mountPath": CA_DIR, "readOnly": True})
    sidecar = [
        "--listen", listen,
        "--mode", MODES[env.spec.capture.mode],
        "--engine", job.spec.policy.endpoint or "",
        "--engine-model", job.spec.policy.model,
        "--spool", posixpath.join(SIDECAR_DIR, "spool"),
        "--confdir", confdir,
        "--job", objects.job_name(job),
        "--rollout-id", name,
        "--task-id", rollout.task_id,
        "--sample-index", str(rollout.sample),
        "--attempt", str(inputs.attempt),
        "--harness", env.metadata.name or "",
        "--api", env.spec.api,
        "--policy-version", str(job.spec.policy.version),
        "--control-token-file", CONTROL_TOKEN,
    ]  # fmt: skip
    trainer = job.spec.trainer
    if trainer is not None:
        sidecar += ["--collector", trainer.endpoint]
        if tokens.token_source(job, config) is not None:
            sidecar += ["--collector-token-file", posixpath.join(TOKEN_DIR, TOKEN_FILE)]
            mounts.append({"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True})
    image = env.spec.capture.sidecar_image or config.sidecar_image
    ready_file = posixpath.join(podrun.RUN_DIR, podrun.SIDECAR_READY)
    return sidecar_container(
        image,
        AGENT_COMMAND,
        args=[*agent, "--", *sidecar],
        mounts=mounts,
        config=config,
        startup_probe=startup_probe,
        ready_file=ready_file,
    )


def sidecar_container(
    image: str,
    command: list[str],
    *,
    args: list[str],
    mounts: list[dict[str, Any]],
    config: settings.Settings,
    startup_probe: bool = True,
    ready_file: str | None = None,
) -> dict[str, Any]:
    """The capture sidecar as a native sidecar: an init container that keeps running.

    With ``startup_probe``, its startup probe holds the later containers back until it
    listens (and ``ready_file`` exists: a rollout pod's ``sidecar-ready``, made once the
    pod is fenced). Without one they start beside it: a rollout pod's harness entrypoint waits
    for the sidecar's ready file instead, and the two containers' starts overlap (an exec
    probe also costs a process in the container every second, and up to a second's wait
    after the sidecar listens before the kubelet sees it).
    """
    container: dict[str, Any] = {
        "name": SIDECAR,
        "image": image,
        "restartPolicy": "Always",
        "command": command,
        "args": args,
        "env": [
            {"name": "HOME", "value": SIDECAR_DIR},
            {"name": "TMPDIR", "value": SIDECAR_DIR},
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        ],
        "resources": copy.deepcopy(config.sidecar_resources),
        "volumeMounts": mounts,
        "securityContext": {
            "runAsUser": config.sidecar_uid,
            "runAsGroup": config.sidecar_uid,
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if startup_probe:
        container["startupProbe"] = {
            "exec": {"command": probe.command(config.sidecar_port, ready_file)},
            "periodSeconds": 1,
            # a Python probe on a node starting many sidecars at once can take
            # over the default 1 s, which would count as a failure (bench/kind_startup.py)
            "timeoutSeconds": 5,
            "failureThreshold": SIDECAR_START_SECONDS,
        }
    if config.image_pull_policy:
        container["imagePullPolicy"] = config.image_pull_policy
    return container


def sidecar_can_read_secrets(pod_security: dict[str, Any], config: settings.Settings) -> None:
    """Let the sidecar (its own user, not root) read the Secret volumes mounted into it.

    The kubelet writes Secret files owned by root, group ``fsGroup`` when the pod sets one,
    with the volume's mode (0440 for the CA key and the collector token): without an
    ``fsGroup`` only root could read them. The pod's ``fsGroup`` becomes the sidecar's
    group unless the template chose its own, which every container of the pod is a member
    of, the sidecar too. The harness being in that group does not expose the key: those
    volumes are mounted into the sidecar container alone.
    """
    pod_security.setdefault("fsGroup", config.sidecar_uid)


def _redirect(
    job: v1alpha1.RolloutJob, env: v1alpha1.HarnessEnv, *, config: settings.Settings
) -> list[dict[str, Any]]:
    """Transparent mode's iptables init container (none in the other modes)."""
    if env.spec.capture.mode != "Transparent":
        return []
    exclude = [_host(job.spec.trainer.endpoint)] if job.spec.trainer is not None else []
    container: dict[str, Any] = {
        "name": REDIRECT,
        "image": env.spec.capture.sidecar_image or config.sidecar_image,
        "command": ["/bin/sh", "-c", REDIRECT_SCRIPT],
        "env": [
            {"name": "OPENFORGE_SIDECAR_UID", "value": str(config.sidecar_uid)},
            {"name": "OPENFORGE_SIDECAR_PORT", "value": str(config.sidecar_port)},
            {"name": "OPENFORGE_REDIRECT_EXCLUDE", "value": " ".join(exclude)},
        ],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]},
        },
    }
    if config.image_pull_policy:
        container["imagePullPolicy"] = config.image_pull_policy
    return [container]


def _volumes(
    job: v1alpha1.RolloutJob, env: v1alpha1.HarnessEnv, *, config: settings.Settings
) -> list[dict[str, Any]]:
    name = objects.job_name(job)
    volumes: list[dict[str, Any]] = [
        {"name": RUN_VOLUME, "emptyDir": {}},
        {"name": SIDECAR_VOLUME, "emptyDir": {}},
    ]
    if env.spec.capture.mode != "BaseURL":
        secret = objects.ca_secret_name(name)
        volumes.append(
            {
                "name": CA_VOLUME,
                "secret": {
                    "secretName": secret,
                    "items": [{"key": CA_KEY, "path": CA_KEY}],
                    "defaultMode": 0o440,
                },
            }
        )
        volumes.append(
            {
                "name": CA_CERT_VOLUME,
                "secret": {
                    "secretName": secret,
                    "items": [{"key": CA_CERT, "path": CA_CERT}],
                    "defaultMode": 0o444,
                },
            }
        )
    token = tokens.token_source(job, config)
    if token is not None:
        secret, key = token
        volumes.append(
            {
                "name": TOKEN_VOLUME,
                "secret": {
                    "secretName": secret,
                    "items": [{"key": key, "path": TOKEN_FILE}],
                    "defaultMode": 0o440,
                },
            }
        )
    return volumes


def task_volume(job: v1alpha1.RolloutJob, rollout: tasks.Rollout) -> dict[str, Any]:
    """The volume holding this rollout's task file, from the job's task-file ConfigMap."""
    return {
        "name": TASK_VOLUME,
        "configMap": {
            "name": objects.task_files_name(objects.job_name(job)),
            "items": [{"key": tasks.file_key(rollout.task_index), "path": TASK_ITEM}],
        },
    }


def _task_path(env: v1alpha1.HarnessEnv, workdir: str | None) -> str:
    assert env.spec.task.file is not None
    path = env.spec.task.file.path
    if posixpath.isabs(path):
        return path
    if not workdir:
        raise PodError(
            f"HarnessEnv {env.metadata.name}: spec.task.file.path {path!r} is relative and the "
            f"{v1alpha1.HARNESS_CONTAINER!r} container sets no workingDir; give an absolute path"
        )
    return posixpath.normpath(posixpath.join(workdir, path))


def _harness_security(
    container: Mapping[str, Any], pod_security: Mapping[str, Any], *, config: settings.Settings
) -> dict[str, Any]:
    security = dict(container.get("securityContext") or {})
    security["runAsNonRoot"] = True
    security["allowPrivilegeEscalation"] = False
    security["capabilities"] = {"drop": ["ALL"]}
    if "runAsUser" not in security and "runAsUser" not in pod_security:
        security["runAsUser"] = config.harness_uid
    return security


def _hardened(container: Mapping[str, Any]) -> dict[str, Any]:
    """A template container with privilege escalation off and capabilities dropped, unless it says
    otherwise."""
    hardened = dict(container)
    security = dict(hardened.get("securityContext") or {})
    security.setdefault("allowPrivilegeEscalation", False)
    security.setdefault("capabilities", {"drop": ["ALL"]})
    hardened["securityContext"] = security
    return hardened


def _merge_env(*layers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Env entries, a later layer's entry replacing an earlier one of the same name in place."""
    merged: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for entry in layer:
            merged[entry["name"]] = entry
    return list(merged.values())


def _expanded(argv: Sequence[str], base: Mapping[str, str], *, where: str) -> list[str]:
    """``argv`` with its ``${NAME}`` references expanded (``rollout_env.expand``); a reference
    to a folder only ``openforge run`` has is an error naming the field."""
    for arg in argv:
        missing = rollout_env.unexpanded(arg, base)
        if missing:
            raise PodError(
                f"{where}: {arg!r} names ${{{missing[0]}}}, a folder of the machine that runs "
                "openforge run; a pod has none (put the file in the image and name its path there)"
            )
    return [rollout_env.expand(arg, base) for arg in argv]


def _host(address: str) -> str:
    """The host of ``host:port`` (brackets of an IPv6 literal removed)."""
    host = address.rpartition(":")[0]
    return host[1:-1] if host.startswith("[") else host
