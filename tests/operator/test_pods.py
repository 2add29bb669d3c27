"""The rollout pod builder: name, ownership, the native sidecar, each capture mode's
wiring, task delivery, the entrypoint around the harness, and the security settings."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openforge.api import retries
from openforge.api import tasks as task_records
from openforge_operator import attempts, entrypoint, objects, pods, settings, tasks
from operator_fixtures import UID, env, job

CONFIG = settings.Settings()


def build(
    *,
    env_spec: dict[str, Any] | None = None,
    job_spec: dict[str, Any] | None = None,
    index: int = 5,
    attempt: int = 1,
    name: str = "job",
    config: settings.Settings = CONFIG,
) -> dict[str, Any]:
    the_job = job(spec=job_spec, name=name)
    records = task_records.inline(the_job.spec.tasks)
    assert records is not None
    rollout = tasks.rollout(records, the_job.spec.samples_per_task, index=index)
    return pods.build_pod(
        job=the_job, env=env(spec=env_spec), rollout=rollout, attempt=attempt, config=config
    )


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    for c in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]:
        if c["name"] == name:
            return c
    raise AssertionError(f"no container {name}")


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def volume(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in pod["spec"]["volumes"] if v["name"] == name)


def mounts(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in c.get("volumeMounts", [])}


# -- identity ------------------------------------------------------------------------------


def test_name_labels_annotations_and_owner() -> None:
    pod = build(index=5, attempt=1)
    meta = pod["metadata"]
    assert meta["name"] == "job-5-1" and meta["namespace"] == "ns"
    assert meta["labels"] == {
        "app": "toy",
        "app.kubernetes.io/managed-by": "openforge-operator",
        "openforge.dev/job": "job",
        "openforge.dev/job-uid": UID,
        "openforge.dev/rollout": "5",
        "openforge.dev/attempt": "1",
    }
    # rollout 5 is sample 1 of task 1 ("b")
    assert meta["annotations"] == {
        "team": "rl",
        "openforge.dev/task-id": "b",
        "openforge.dev/sample": "1",
        "openforge.dev/policy-version": "3",
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "openforge.dev/v1alpha1",
            "kind": "RolloutJob",
            "name": "job",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def test_a_pod_holds_the_operators_finalizer_and_records_the_attempts_before_it() -> None:
    first = build(attempt=0)
    assert first["metadata"]["finalizers"] == ["openforge.dev/attempt-record"]
    assert "openforge.dev/earlier-attempts" not in first["metadata"]["annotations"]
    the_job = job()
    records = task_records.inline(the_job.spec.tasks)
    assert records is not None
    earlier = (retries.Tried(1, False, None, "Evicted"), retries.Tried(0, False, 3, None))
    third = pods.build_pod(
        job=the_job,
        env=env(),
        rollout=tasks.rollout(records, the_job.spec.samples_per_task, index=5),
        attempt=2,
        config=CONFIG,
        earlier=earlier,
    )
    meta = third["metadata"]
    assert meta["finalizers"] == ["openforge.dev/attempt-record"]
    assert json.loads(meta["annotations"]["openforge.dev/earlier-attempts"]) == [
        {"attempt": 0, "exitCode": 3, "reason": None},
        {"attempt": 1, "exitCode": None, "reason": "Evicted"},
    ]
    summary = attempts.summarize({**third, "status": {"phase": "Pending"}})
    assert summary is not None and summary.held
    assert summary.earlier == tuple(sorted(earlier, key=lambda t: t.attempt))


def test_pod_names_stay_within_63_characters_and_distinct() -> None:
    long_a, long_b = "a" * 60 + "-x", "a" * 60 + "-y"
    name_a, name_b = (
        objects.pod_name(long_a, 12345, attempt=2),
        objects.pod_name(long_b, 12345, attempt=2),
    )
    assert len(name_a) <= 63 and len(name_b) <= 63 and name_a != name_b
    assert name_a.endswith("-12345-2") and name_a.startswith("a" * 40)
    assert objects.pod_name("short", 1, attempt=0) == "short-1-0"
    assert objects.pod_name(long_a, 12345, attempt=2) == name_a, "deterministic"
    pod = build(name="j" * 63, index=11, attempt=0)
    assert (
        len(pod["metadata"]["name"]) <= 63
        and pod["metadata"]["labels"]["openforge.dev/job"] == "j" * 63
    )


def test_pod_spec_basics() -> None:
    spec = build()["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    # 120 s harness + 40 s grader + finish wait + slack
    assert (
        spec["activeDeadlineSeconds"]
        == 120 + 40 + CONFIG.finish_wait_seconds + CONFIG.pod_deadline_slack_seconds
    )
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
        "fsGroup": CONFIG.sidecar_uid,
    }


def test_the_sidecar_can_read_its_0440_secrets() -> None:
    """Secret files are root-owned, group fsGroup: without one the sidecar's user cannot
    read the CA key or the token (PermissionError on a real node)."""
    pod = build(env_spec={"capture": {"mode": "Proxy"}})
    spec = pod["spec"]
    sidecar = container(pod, "openforge-sidecar")
    modes = {v["name"]: v["secret"]["defaultMode"] for v in spec["volumes"] if "secret" in v}
    assert modes["openforge-ca"] == 0o440
    assert (
        spec["securityContext"]["fsGroup"]
        == sidecar["securityContext"]["runAsGroup"]
        == CONFIG.sidecar_uid
    )
    mounted = {m["name"] for m in container(pod, "harness")["volumeMounts"]}
    assert "openforge-ca" not in mounted and "openforge-token" not in mounted, (
        "key and token only in the sidecar"
    )
    own = build(
        env_spec={
            "template": {
                "spec": {
                    "securityContext": {"fsGroup": 2000},
                    "containers": [{"name": "harness", "image": "i", "command": ["c"]}],
                }
            }
        }
    )
    assert own["spec"]["securityContext"]["fsGroup"] == 2000, (
        "a template's fsGroup is kept: the sidecar is in it too"
    )


def test_the_jobs_rollout_timeout_wins_over_the_harness_envs() -> None:
    spec = build(job_spec={"rolloutTimeoutSeconds": 1000})["spec"]
    assert (
        spec["activeDeadlineSeconds"]
        == 1000 + 40 + CONFIG.finish_wait_seconds + CONFIG.pod_deadline_slack_seconds
    )


# -- the sidecar -----------------------------------------------------------------------------


def test_the_sidecar_is_a_native_sidecar_the_harness_waits_for() -> None:
    pod = build()
    init = pod["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["openforge-sidecar"]
    sidecar = init[0]
    assert sidecar["restartPolicy"] == "Always"
    # the harness starts beside it and its entrypoint waits for the sidecar's ready file
    assert "startupProbe" not in sidecar
    assert env_of(container(pod, "harness"))["OPENFORGE_SIDECAR_WAIT"] == str(
        pods.SIDECAR_START_SECONDS
    )
    assert sidecar["image"] == CONFIG.sidecar_image
    assert sidecar["command"] == ["python", "-m", "openforge_sidecar.podagent"]
    security = sidecar["securityContext"]
    assert (
        security["runAsUser"] == CONFIG.sidecar_uid and security["readOnlyRootFilesystem"] is True
    )
    assert (
        security["capabilities"] == {"drop": ["ALL"]}
        and security["allowPrivilegeEscalation"] is False
    )


@pytest.mark.parametrize("own", [
    {"initContainers": [{"name": "prepare", "image": "p"}]},
    {"containers": [{"name": "harness", "image": "i", "command": ["c"]},
                    {"name": "browser", "image": "b"}]},
])  # fmt: skip
def test_containers_of_the_templates_own_are_held_back_by_a_startup_probe(
    own: dict[str, Any],
) -> None:
    """Those do not run under the entrypoint: only the kubelet can hold them back until the sidecar
    listens."""
    template = {"containers": [{"name": "harness", "image": "i", "command": ["c"]}], **own}
    sidecar = container(build(env_spec={"template": {"spec": template}}), "openforge-sidecar")
    # the kubelet dials tcpSocket/httpGet probes from the node, where 127.0.0.1 is not the pod's
    # loopback ... and it passes only once the agent made sidecar-ready, i.e. the pod is fenced
    assert sidecar["startupProbe"]["exec"]["command"] == [
        "python", "-m", "openforge_operator.probe", str(CONFIG.sidecar_port),
        "/openforge/run/sidecar-ready",
    ]  # fmt: skip
    assert "tcpSocket" not in sidecar["startupProbe"] and "httpGet" not in sidecar["startupProbe"]
    assert sidecar["startupProbe"]["timeoutSeconds"] == 5, (
        "a slow probe on a busy node is not a failed one"
    )
    assert sidecar["startupProbe"]["failureThreshold"] == pods.SIDECAR_START_SECONDS


def sidecar_args(pod: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    args = container(pod, "openforge-sidecar")["args"]
    split = args.index("--")
    agent, sidecar = args[:split], args[split + 1 :]
    return agent, dict(zip(sidecar[::2], sidecar[1::2], strict=True))


def test_the_sidecar_knows_its_rollout_policy_and_collector() -> None:
    agent, flags = sidecar_args(build(index=5, attempt=1))
    assert flags == {
        "--listen": "127.0.0.1:15090", "--mode": "reverse", "--engine": "http://vllm.models.svc:8000",
        "--engine-model": "tiny", "--spool": "/openforge/sidecar/spool",
        "--confdir": "/openforge/sidecar/confdir",
        "--job": "job", "--rollout-id": "job-5-1", "--task-id": "b", "--sample-index": "1",
        "--attempt": "1",
        "--harness": "env", "--api": "openai-chat", "--policy-version": "3",
        "--collector": "collector.openforge.svc:50051",
        "--control-token-file": "/openforge/sidecar/control-token",
    }  # fmt: skip
    assert agent == [
        "--listen", "127.0.0.1:15090", "--reward-from", "stdout-json", "--failing-exit-codes", "",
        "--finish-wait", "60",
        "--control-token-file", "/openforge/sidecar/control-token", "--fence-wait", "60",
    ]  # fmt: skip


def test_the_harness_waits_for_the_fence_unless_the_operator_is_told_not_to() -> None:
    agent, _ = sidecar_args(build())
    assert agent[agent.index("--fence-wait") + 1] == str(CONFIG.fence_wait_seconds)
    unfenced, _ = sidecar_args(build(config=settings.Settings(fence_wait_seconds=0)))
    assert "--fence-wait" not in unfenced


def test_only_the_sidecar_mounts_the_volume_of_its_control_token() -> None:
    """The harness reaches the sidecar's port, never its token: it cannot report its own rollout."""
    pod = build()
    assert pods.CONTROL_TOKEN.startswith(pods.SIDECAR_DIR + "/")
    holders = [
        c["name"]
        for c in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]
        if pods.SIDECAR_VOLUME in mounts(c)
    ]
    assert holders == ["openforge-sidecar"]


def test_the_collector_token_is_mounted_into_the_sidecar_only() -> None:
    pod = build(
        job_spec={
            "trainer": {
                "endpoint": "c:1",
                "tokenSecretRef": {"name": "collector-token", "key": "token"},
            }
        }
    )
    _, flags = sidecar_args(pod)
    assert flags["--collector-token-file"] == "/openforge/token/token"
    assert volume(pod, "openforge-token")["secret"] == {
        "secretName": "collector-token", "items": [{"key": "token", "path": "token"}],
        "defaultMode": 0o440,
    }  # fmt: skip
    assert "openforge-token" in mounts(container(pod, "openforge-sidecar"))
    assert "openforge-token" not in mounts(container(pod, "harness"))


def test_with_a_master_key_the_sidecar_mounts_the_token_the_operator_issued_the_job() -> None:
    config = settings.Settings(collector_master_key=b"k" * 32)
    for mode in ("BaseURL", "Proxy", "Transparent"):
        pod = build(config=config, env_spec={"capture": {"mode": mode}})
        _, flags = sidecar_args(pod)
        assert flags["--collector-token-file"] == "/openforge/token/token"
        assert volume(pod, "openforge-token")["secret"] == {
            "secretName": "job-collector-token", "items": [{"key": "token", "path": "token"}],
            "defaultMode": 0o440,
        }  # fmt: skip
        holders = [
            c["name"]
            for c in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]
            if "openforge-token" in mounts(c)
        ]
        assert holders == ["openforge-sidecar"], mode
    explicit = build(
        config=config,
        job_spec={"trainer": {"endpoint": "c:1", "tokenSecretRef": {"name": "mine", "key": "k"}}},
    )
    assert volume(explicit, "openforge-token")["secret"]["secretName"] == "mine", (
        "an explicit tokenSecretRef wins"
    )
    without = build()
    assert "--collector-token-file" not in sidecar_args(without)[1]
    assert "openforge-token" not in {v["name"] for v in without["spec"]["volumes"]}


# -- the harness ---------------------------------------------------------------------------


def test_the_harness_runs_under_the_entrypoint_then_the_grader() -> None:
    harness = container(build(index=5), "harness")
    assert harness["command"] == entrypoint.COMMAND
    # the grader's 4 args first, then the harness command, its args, with ${OPENFORGE_TASK_ID}
    # expanded
    assert harness["args"] == [
        "4",
        "python",
        "grade.py",
        "--task",
        "b",
        "python",
        "-m",
        "agent",
        "--task",
        "b",
    ]
    assert mounts(harness)["openforge-run"]["mountPath"] == "/openforge/run"


def test_without_a_grader_the_entrypoint_gets_none_and_the_agent_rewards_the_exit_code() -> None:
    pod = build(env_spec={"grader": None})
    assert container(pod, "harness")["args"] == ["0", "python", "-m", "agent", "--task", "b"]
    agent, _ = sidecar_args(pod)
    assert agent[agent.index("--reward-from") + 1] == "none"


def test_harness_env_layers() -> None:
    pod = build(index=5, attempt=1, env_spec={
        "template": {"spec": {"containers": [{
            "name": "harness", "image": "i", "command": ["run"],
            "env": [{"name": "OPENFORGE_WORKDIR", "value": "/mine"},
                    {"name": "PROMPT", "value": "template"},
                    {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        }]}},
        "task": {"env": {"PROMPT": "{{ task.prompt }}", "TASK": "{{ task }}"}},
    })  # fmt: skip
    values = env_of(container(pod, "harness"))
    assert values["OPENFORGE_JOB"] == "job" and values["OPENFORGE_ROLLOUT_ID"] == "job-5-1"
    assert (
        values["OPENFORGE_TASK_ID"] == "b"
        and values["OPENFORGE_SAMPLE_INDEX"] == "1"
        and values["OPENFORGE_ATTEMPT"] == "1"
    )
    assert json.loads(values["OPENFORGE_TASK_JSON"]) == {"id": "b", "prompt": "p-b"}
    assert values["OPENFORGE_WORKDIR"] == "/mine", "the template overrides the base env, as locally"
    assert values["PROMPT"] == "p-b", "task delivery overrides the template"
    assert json.loads(values["TASK"]) == {"id": "b", "prompt": "p-b"}
    assert values["SECRET"] == {"secretKeyRef": {"name": "s", "key": "k"}}
    assert values["OPENAI_BASE_URL"] == "http://127.0.0.1:15090/v1"
    names = [e["name"] for e in container(pod, "harness")["env"]]
    assert len(names) == len(set(names))


def test_task_args_are_appended_after_the_harness_args() -> None:
    harness = container(
        build(index=0, env_spec={"task": {"args": ["--prompt={{ task.prompt }}"]}}), "harness"
    )
    assert harness["args"][-3:] == ["--task", "a", "--prompt=p-a"]


def test_a_task_file_is_mounted_from_the_jobs_config_map() -> None:
    pod = build(index=9, env_spec={"task": {"file": {"path": "/work/task.json"}}})
    assert volume(pod, "openforge-task")["configMap"] == {
        "name": "job-taskfiles",
        "items": [{"key": "task-2", "path": "task"}],
    }
    mount = mounts(container(pod, "harness"))["openforge-task"]
    assert mount == {
        "name": "openforge-task",
        "mountPath": "/work/task.json",
        "subPath": "task",
        "readOnly": True,
    }


def test_a_relative_task_file_needs_a_working_directory() -> None:
    with pytest.raises(pods.PodError, match="relative"):
        build(env_spec={"task": {"file": {"path": "task.json"}}})
    spec = {
        "task": {"file": {"path": "in/task.json"}},
        "template": {
            "spec": {
                "containers": [
                    {"name": "harness", "image": "i", "command": ["c"], "workingDir": "/w"}
                ]
            }
        },
    }
    assert (
        mounts(container(build(env_spec=spec), "harness"))["openforge-task"]["mountPath"]
        == "/w/in/task.json"
    )


def test_a_harness_without_command_or_image_cannot_run_in_a_cluster() -> None:
    with pytest.raises(pods.PodError, match=r"command is required"):
        build(env_spec={"template": {"spec": {"containers": [{"name": "harness", "image": "i"}]}}})
    with pytest.raises(pods.PodError, match=r"image is required"):
        build(
            env_spec={"template": {"spec": {"containers": [{"name": "harness", "command": ["c"]}]}}}
        )


def test_the_harness_runs_non_root_without_capabilities() -> None:
    security = container(build(), "harness")["securityContext"]
    assert security == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsUser": CONFIG.harness_uid,
    }
    spec = {
        "template": {
            "spec": {
                "securityContext": {"runAsUser": 4242},
                "containers": [
                    {
                        "name": "harness",
                        "image": "i",
                        "command": ["c"],
                        "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}},
                    }
                ],
            }
        }
    }
    security = container(build(env_spec=spec), "harness")["securityContext"]
    assert "runAsUser" not in security, "the pod's user stands"
    assert security["capabilities"] == {"drop": ["ALL"]}, "the harness gets no capability"


def test_other_template_containers_are_hardened_unless_they_say_otherwise() -> None:
    spec = {"template": {"spec": {
        "initContainers": [{"name": "prepare", "image": "p"}],
        "containers": [{"name": "harness", "image": "i", "command": ["c"]},
                       {"name": "tools", "image": "t",
                        "securityContext": {"allowPrivilegeEscalation": True}}],
    }}}  # fmt: skip
    pod = build(env_spec=spec)
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["openforge-sidecar", "prepare"]
    assert container(pod, "prepare")["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container(pod, "tools")["securityContext"]["allowPrivilegeEscalation"] is True


# -- capture modes ---------------------------------------------------------------------------


def test_proxy_mode_points_the_harness_at_the_sidecar_as_its_proxy_and_trusts_the_jobs_ca() -> None:
    pod = build(env_spec={"capture": {"mode": "Proxy"}, "baseUrl": None})
    values = env_of(container(pod, "harness"))
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert values[name] == "http://127.0.0.1:15090"
    assert values["NO_PROXY"] == "127.0.0.1,localhost"
    for name in pods.CA_TRUST_ENV:
        assert values[name] == "/openforge/ca-cert/ca.crt"
    agent, flags = sidecar_args(pod)
    assert flags["--mode"] == "regular"
    assert agent[-4:] == [
        "--ca-file",
        "/openforge/ca/mitmproxy-ca.pem",
        "--confdir",
        "/openforge/sidecar/confdir",
    ]


@pytest.mark.parametrize("mode", ["Proxy", "Transparent"])
def test_the_ca_key_reaches_only_the_sidecar(mode: str) -> None:
    pod = build(env_spec={"capture": {"mode": mode}})
    assert volume(pod, "openforge-ca")["secret"]["items"] == [
        {"key": "mitmproxy-ca.pem", "path": "mitmproxy-ca.pem"}
    ]
    assert volume(pod, "openforge-ca-cert")["secret"]["items"] == [
        {"key": "ca.crt", "path": "ca.crt"}
    ]
    assert volume(pod, "openforge-ca")["secret"]["secretName"] == "job-ca"
    assert set(mounts(container(pod, "openforge-sidecar"))) == {
        "openforge-run",
        "openforge-sidecar",
        "openforge-ca",
    }
    harness_mounts = mounts(container(pod, "harness"))
    assert (
        "openforge-ca" not in harness_mounts
        and harness_mounts["openforge-ca-cert"]["readOnly"] is True
    )


def test_transparent_mode_redirects_with_an_iptables_init_container() -> None:
    pod = build(env_spec={"capture": {"mode": "Transparent"}})
    init = pod["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["openforge-redirect", "openforge-sidecar"]
    redirect = init[0]
    assert redirect["securityContext"]["capabilities"] == {
        "add": ["NET_ADMIN", "NET_RAW"],
        "drop": ["ALL"],
    }
    assert redirect["securityContext"]["runAsUser"] == 0 and "restartPolicy" not in redirect
    values = env_of(redirect)
    assert values == {
        "OPENFORGE_SIDECAR_UID": "1337",
        "OPENFORGE_SIDECAR_PORT": "15090",
        "OPENFORGE_REDIRECT_EXCLUDE": "collector.openforge.svc",
    }
    assert (
        "--uid-owner" in redirect["command"][2] and "REDIRECT --to-ports" in redirect["command"][2]
    )
    values = env_of(container(pod, "harness"))
    assert "HTTPS_PROXY" not in values and values["SSL_CERT_FILE"] == "/openforge/ca-cert/ca.crt"
    assert sidecar_args(pod)[1]["--mode"] == "transparent"


def test_only_the_transparent_init_container_adds_a_capability() -> None:
    for mode in ("BaseURL", "Proxy", "Transparent"):
        pod = build(env_spec={"capture": {"mode": mode}})
        adders = [
            c["name"]
            for c in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]
            if c.get("securityContext", {}).get("capabilities", {}).get("add")
        ]
        assert adders == (["openforge-redirect"] if mode == "Transparent" else [])


def test_failing_exit_codes_mirror_the_failure_policy() -> None:
    assert pods.failing_exit_codes(job()) == ""
    retry = {
        "failurePolicy": {
            "rules": [
                {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [2, 3]}},
                {"action": "Retry", "onReasons": ["Evicted"]},
            ]
        }
    }
    assert pods.failing_exit_codes(job(spec=retry)) == "1,4-255"
    agent, _ = sidecar_args(build(job_spec=retry))
    assert agent[agent.index("--failing-exit-codes") + 1] == "1,4-255"


def test_the_pod_is_plain_json() -> None:
    assert json.loads(
        json.dumps(
            build(env_spec={"capture": {"mode": "Transparent"}, "task": {"file": {"path": "/t"}}})
        )
    )
