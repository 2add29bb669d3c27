"""The v1alpha1 models through ``load_manifests``: valid YAML round-trips, and every
constraint fails with the field's path and the line it is on."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml
from openforge.api import manifests, v1alpha1

VALID = (Path(__file__).parent / "fixtures" / "valid.yaml").read_text()
"""A HarnessEnv and a RolloutJob that set every field; the cases below each break one."""


def assert_subset(given: Any, produced: Any, where: str = "") -> None:
    """Everything the manifest said is in the model's output, unchanged."""
    if isinstance(given, dict):
        assert isinstance(produced, dict), where
        for key, value in given.items():
            assert key in produced, f"{where}.{key} was dropped"
            assert_subset(value, produced[key], f"{where}.{key}")
    elif isinstance(given, list):
        assert isinstance(produced, list) and len(given) == len(produced), where
        for i, (a, b) in enumerate(zip(given, produced, strict=True)):
            assert_subset(a, b, f"{where}[{i}]")
    else:
        assert given == produced, f"{where}: {given!r} became {produced!r}"


def load(text: str) -> list[v1alpha1.Resource]:
    return manifests.load_manifests(text)


# -- valid manifests ----------------------------------------------------------------------


def test_valid_manifests_round_trip_through_the_models() -> None:
    env, job = load(VALID)
    assert isinstance(env, v1alpha1.HarnessEnv) and isinstance(job, v1alpha1.RolloutJob)
    documents = [document for document in yaml.safe_load_all(VALID)]
    for resource, document in zip((env, job), documents, strict=True):
        produced = resource.to_dict()
        assert_subset(document, produced)
        assert type(resource).model_validate(produced, by_name=False) == resource


def test_defaults_and_typed_access() -> None:
    env, job = load(VALID)
    assert isinstance(env, v1alpha1.HarnessEnv) and isinstance(job, v1alpha1.RolloutJob)
    assert env.spec.capture.mode == "BaseURL" and env.spec.task.file is not None
    assert env.spec.task.file.format == "json"
    assert job.spec.tasks.inline is not None and job.spec.tasks.inline[1].model_extra == {
        "prompt": "What is 2+2?",
        "answer": 4,
        "meta": {"difficulty": "easy", "tags": ["math"]},
    }
    assert job.status is not None and job.status.start_time == datetime(2025, 1, 1, tzinfo=UTC)
    assert job.rollout_name(5, 1) == "react-toy-5-1"
    minimal = load(_minimal_job())[0]
    assert isinstance(minimal, v1alpha1.RolloutJob)
    assert (
        minimal.spec.samples_per_task,
        minimal.spec.parallelism,
        minimal.spec.max_attempts_per_rollout,
    ) == (1, 1, 3)
    assert minimal.spec.suspend is False and minimal.status is None


def test_yaml_reads_as_kubectl_reads_it() -> None:
    """1e-6 is a float (PyYAML alone reads a string) and a date stays a string (not a datetime)."""
    text = VALID.replace("learningRate: 1.0e-6", "learningRate: 1e-6")
    text = text.replace("      answer: 2\n", "      answer: 2\n      due: 2025-01-01\n")
    job = load(text)[1]
    assert isinstance(job, v1alpha1.RolloutJob) and job.spec.training is not None
    assert job.spec.training.learning_rate == 1e-6
    assert job.spec.tasks.inline is not None
    assert job.spec.tasks.inline[0].model_extra == {
        "prompt": "What is 1+1?",
        "answer": 2,
        "due": "2025-01-01",
    }


def test_python_code_may_use_field_names_yaml_may_not() -> None:
    capture = v1alpha1.Capture(mode="Proxy", allowed_hosts=["pypi.org"])
    assert capture.to_dict() == {"mode": "Proxy", "allowedHosts": ["pypi.org"]}


def test_the_pod_template_keeps_every_field_it_does_not_model() -> None:
    (env,) = [r for r in load(VALID) if isinstance(r, v1alpha1.HarnessEnv)]
    template = env.to_dict()["spec"]["template"]
    assert template["spec"]["securityContext"] == {"runAsNonRoot": True}
    assert template["spec"]["containers"][1]["resources"] == {
        "limits": {"cpu": "1", "memory": "1Gi"}
    }
    assert env.spec.harness_container().image == "ghcr.io/example/react:1"


def test_local_process_takes_local_overrides_over_the_harness_container() -> None:
    env = load(VALID)[0]
    assert isinstance(env, v1alpha1.HarnessEnv)
    process = env.spec.local_process()
    assert process.argv == ["python", "-m", "react_agent", "--max-turns", "8"]
    assert process.env == {"LOG_LEVEL": "debug", "HOME": "/home/agent"}
    without_local = env.spec.model_copy(update={"local": None})
    assert without_local.local_process().env["LOG_LEVEL"] == "info"


def test_local_process_refuses_what_only_a_cluster_can_run() -> None:
    env = load(VALID)[0]
    assert isinstance(env, v1alpha1.HarnessEnv)
    harness = env.spec.harness_container()
    no_command = env.spec.model_copy(update={"local": None})
    no_command.template.spec.containers[1] = harness.model_copy(update={"command": None})
    with pytest.raises(ValueError, match="needs a command to run locally"):
        no_command.local_process()
    secret = env.spec.model_copy(update={"local": None})
    secret.template.spec.containers[1] = harness.model_copy(
        update={
            "env": [
                v1alpha1.EnvVar.model_validate({"name": "KEY", "valueFrom": {"secretKeyRef": {}}})
            ]
        }
    )
    with pytest.raises(ValueError, match=r"env var KEY .*\(valueFrom works only in a cluster\)"):
        secret.local_process()


def test_failure_policy_first_match_wins_and_unmatched_is_retried() -> None:
    job = load(VALID)[1]
    assert isinstance(job, v1alpha1.RolloutJob)
    assert job.spec.failure_action(exit_code=42, reason=None) == "FailRollout"
    assert job.spec.failure_action(exit_code=1, reason="Evicted") == "Ignore"
    assert job.spec.failure_action(exit_code=1, reason="OOMKilled") == "Retry"
    not_in = v1alpha1.FailureRule.model_validate(
        {"action": "FailRollout", "onExitCodes": {"operator": "NotIn", "values": [0, 1]}}
    )
    assert not_in.matches(exit_code=2, reason=None) and not not_in.matches(exit_code=1, reason=None)


def test_cluster_problems_name_the_fields_only_openforge_run_can_fill() -> None:
    job = load(VALID)[1]
    assert isinstance(job, v1alpha1.RolloutJob)
    assert v1alpha1.cluster_problems(job) == []
    local = load(_minimal_job().replace("inline: [{id: a}]", "file: tasks.jsonl"))[0]
    assert isinstance(local, v1alpha1.RolloutJob)
    problems = v1alpha1.cluster_problems(local)
    assert [p.split()[0] for p in problems] == [
        "spec.tasks.file",
        "spec.policy.endpoint",
        "spec.trainer",
    ]


def test_set_condition_moves_the_transition_time_only_on_a_status_change() -> None:
    t0, t1 = datetime(2025, 1, 1, tzinfo=UTC), datetime(2025, 1, 2, tzinfo=UTC)
    running = v1alpha1.Condition(
        type="Complete", status="False", reason="Running", last_transition_time=t0
    )
    still = running.model_copy(update={"message": "5 of 8", "last_transition_time": t1})
    conditions = v1alpha1.set_condition([running], still)
    assert conditions[0].last_transition_time == t0 and conditions[0].message == "5 of 8"
    done = v1alpha1.Condition(
        type="Complete", status="True", reason="AllDone", last_transition_time=t1
    )
    conditions = v1alpha1.set_condition(conditions, done)
    assert len(conditions) == 1 and conditions[0].last_transition_time == t1
    assert v1alpha1.find_condition(conditions, "Complete") == done
    assert v1alpha1.find_condition(conditions, "Failed") is None


def test_parse_validates_an_api_object_without_lines() -> None:
    job = load(VALID)[1]
    body = job.to_dict() | {
        "metadata": {
            "name": "x",
            "uid": "u1",
            "generation": 2,
            "managedFields": [{"manager": "kubectl"}],
        }
    }
    assert isinstance(manifests.parse(body), v1alpha1.RolloutJob)
    body["spec"] = body["spec"] | {"parallelism": 0}
    with pytest.raises(manifests.ManifestError) as caught:
        manifests.parse(body)
    (problem,) = caught.value.problems
    assert (problem.path, problem.line) == ("spec.parallelism", None)
    assert str(problem).startswith(
        "spec.parallelism: input should be greater than or equal to 1, got 0"
    )


def test_load_manifests_reads_a_path_and_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(VALID.replace("samplesPerTask: 4", "samplesPerTask: 0"))
    line = VALID.splitlines().index("  samplesPerTask: 4") + 1
    for source in (path, str(path)):
        with pytest.raises(manifests.ManifestError) as caught:
            manifests.load_manifests(source)
        assert str(caught.value).startswith(f"{path}:{line}: spec.samplesPerTask: ")
    path.write_text(VALID)
    assert len(manifests.load_manifests(path)) == 2


def test_empty_documents_are_skipped() -> None:
    assert len(load("---\n---\n" + VALID + "---\n")) == 2


def test_plain_pydantic_errors_still_name_the_field() -> None:
    """The operator may validate with the models directly; the message must still say which
    field."""
    with pytest.raises(
        pydantic.ValidationError, match=r"baseUrl: required when capture.mode is BaseURL"
    ):
        v1alpha1.HarnessEnvSpec.model_validate(
            {
                "api": "openai-chat",
                "template": {"spec": {"containers": [{"name": "harness", "image": "x"}]}},
            }
        )


# -- invalid manifests ------------------------------------------------------------------

MARK = "  # <-"


def mutate(old: str, new: str) -> tuple[str, int]:
    """VALID with ``old`` replaced by ``new``; the line marked ``# <-`` in ``new`` is where the
    error must point."""
    assert VALID.count(old) == 1, old
    text = VALID.replace(old, new)
    (line,) = [i + 1 for i, content in enumerate(text.splitlines()) if content.endswith(MARK)]
    return text, line


CASES = [
    # (id, old, new (with the expected line marked), path, text in the message)
    (
        "wrong type",
        "  samplesPerTask: 4",
        '  samplesPerTask: "4"' + MARK,
        "spec.samplesPerTask",
        "valid integer, got '4' (expected an integer >= 1 and <= 4096)",
    ),
    (
        "bool as string",
        "  suspend: false",
        '  suspend: "no"' + MARK,
        "spec.suspend",
        "valid boolean",
    ),
    (
        "unknown field",
        "  parallelism: 2",
        "  parallelism: 2\n  samplesPerTsk: 2" + MARK,
        "spec.samplesPerTsk",
        "unknown field (did you mean samplesPerTask?)",
    ),
    (
        "snake_case field",
        "  parallelism: 2",
        "  parallel_ism: 2" + MARK,
        "spec.parallel_ism",
        "unknown field",
    ),
    (
        "unknown nested field",
        "    mode: BaseURL",
        "    mode: BaseURL\n    allowedHost: [x]" + MARK,
        "spec.capture.allowedHost",
        "did you mean allowedHosts?",
    ),
    (
        "samplesPerTask 0",
        "  samplesPerTask: 4",
        "  samplesPerTask: 0" + MARK,
        "spec.samplesPerTask",
        "greater than or equal to 1, got 0",
    ),
    (
        "parallelism 0",
        "  parallelism: 2",
        "  parallelism: 0" + MARK,
        "spec.parallelism",
        "greater than or equal to 1",
    ),
    (
        "maxAttempts 0",
        "  maxAttemptsPerRollout: 2",
        "  maxAttemptsPerRollout: 0" + MARK,
        "spec.maxAttemptsPerRollout",
        "greater than or equal to 1",
    ),
    (
        "two task sources",
        "  tasks:\n    inline:",
        "  tasks:" + MARK + "\n    file: tasks.jsonl\n    inline:",
        "spec.tasks",
        "set exactly one of inline, configMapRef, file, got ['inline', 'file']",
    ),
    (
        "no task source",
        "  tasks:\n    inline:\n    - id: add-1\n      prompt: What is 1+1?\n      answer: 2\n"
        "    - id: add-2\n      prompt: What is 2+2?\n      answer: 4\n"
        "      meta: {difficulty: easy, tags: [math]}",
        "  tasks: {}" + MARK,
        "spec.tasks",
        "got none",
    ),
    (
        "task without id",
        "    - id: add-2\n",
        "    - name: add-2" + MARK + "\n",
        "spec.tasks.inline[1].id",
        "required field is missing",
    ),
    (
        "repeated task id",
        "    - id: add-2\n",
        "    - id: add-1" + MARK + "\n",
        "spec.tasks.inline[1].id",
        "'add-1' is already the id of item 0",
    ),
    (
        "no harness container",
        "      containers:\n      - name: tools\n        image: ghcr.io/example/tools:1\n"
        "      - name: harness\n",
        "      containers:"
        + MARK
        + "\n      - name: tools\n        image: ghcr.io/example/tools:1\n      - name: agent\n",
        "spec.template.spec.containers",
        "exactly one container named 'harness', got ['tools', 'agent']",
    ),
    (
        "harness without image or command",
        "      - name: harness\n        image: ghcr.io/example/react:1\n"
        "        command: [python, -m, react_agent]\n",
        "      - name: harness" + MARK + "\n",
        "spec.template.spec.containers[1]",
        "needs an image, a command, or both",
    ),
    (
        "no template spec",
        "  template:\n    metadata:\n      labels: {app: react}\n    spec:\n",
        "  template:" + MARK + "\n    metadata:\n      labels: {app: react}\n    sp3c:\n",
        "spec.template.spec",
        "required field is missing",
    ),
    (
        "bad placeholder",
        '      TASK_PROMPT: "{{ task.prompt }}"',
        '      TASK_PROMPT: "{{ prompt }}"' + MARK,
        "spec.task.env.TASK_PROMPT",
        "placeholder '{{ prompt }}'",
    ),
    (
        "bad arg placeholder",
        '    args: ["--task-id={{ task.id }}"]',
        '    args: ["--task-id={{ task.id"]' + MARK,
        "spec.task.args[0]",
        "unclosed placeholder",
    ),
    (
        "bad env name",
        '      TASK_PROMPT: "{{ task.prompt }}"',
        '      "1 X": "{{ task.prompt }}"' + MARK,
        "spec.task.env['1 X']",
        "is not an env var name",
    ),
    (
        "text file without template",
        "    file: {path: /tmp/task.json, format: json}",
        "    file: {path: /tmp/task.txt, format: text}" + MARK,
        "spec.task.file.template",
        "required when format is text",
    ),
    (
        "bad capture mode",
        "    mode: BaseURL",
        "    mode: BaseUrl" + MARK,
        "spec.capture.mode",
        "'BaseUrl' is not allowed (expected one of BaseURL, Proxy, Transparent)",
    ),
    (
        "bad api",
        "  api: openai-chat",
        "  api: openai" + MARK,
        "spec.api",
        "expected one of openai-chat, openai-responses, anthropic-messages, gemini",
    ),
    (
        "BaseURL mode without baseUrl",
        "spec:\n  api: openai-chat\n  baseUrl:\n    env: [OPENAI_BASE_URL]\n    suffix: /v1\n",
        "spec:" + MARK + "\n  api: openai-chat\n",
        "spec.baseUrl",
        "required when capture.mode is BaseURL",
    ),
    (
        "bad suffix",
        "    suffix: /v1",
        "    suffix: v1" + MARK,
        "spec.baseUrl.suffix",
        "must start with '/'",
    ),
    (
        "both failure matchers",
        "    - action: Ignore\n      onReasons: [Evicted, Preempted]",
        "    - action: Ignore"
        + MARK
        + "\n      onReasons: [Evicted]\n      onExitCodes: {operator: In, values: [1]}",
        "spec.failurePolicy.rules[1]",
        "set exactly one of onExitCodes, onReasons",
    ),
    (
        "unknown failure reason",
        "      onReasons: [Evicted, Preempted]",
        "      onReasons: [Evicted, Bored]" + MARK,
        "spec.failurePolicy.rules[1].onReasons[1]",
        "'Bored' is not allowed",
    ),
    (
        "exit code out of range",
        "values: [42]}",
        "values: [256]}" + MARK,
        "spec.failurePolicy.rules[0].onExitCodes.values[0]",
        "less than or equal to 255",
    ),
    (
        "bad policy endpoint",
        '  policy: {endpoint: "http://policy:8000/v1", model: tiny, version: 3}',
        "  policy:\n    endpoint: policy:8000" + MARK + "\n    model: tiny",
        "spec.policy.endpoint",
        "'policy:8000' does not match the pattern",
    ),
    (
        "bad trainer endpoint",
        "    endpoint: collector.rl.svc:50051",
        "    endpoint: collector.rl.svc" + MARK,
        "spec.trainer.endpoint",
        "does not match the pattern",
    ),
    (
        "learning rate 0",
        "  training: {iterations: 10, groupsPerStep: 2, learningRate: 1.0e-6, seed: 7, options: "
        "{clipRatioHigh: 0.28}}",
        "  training:\n    iterations: 10\n    learningRate: 0.0" + MARK,
        "spec.training.learningRate",
        "greater than 0, got 0.0 (expected a number > 0)",
    ),
    (
        "bad failedIndexes",
        '  failedIndexes: "1,3-5"',
        '  failedIndexes: "1,5-3"' + MARK,
        "status.failedIndexes",
        "range '5-3' in '1,5-3' must run from low to high",
    ),
    (
        "bad condition status",
        '    status: "False"',
        "    status: false" + MARK,
        "status.conditions[0].status",
        "is not allowed",
    ),
    (
        "bad timestamp",
        '  startTime: "2025-01-01T00:00:00Z"',
        '  startTime: "yesterday"' + MARK,
        "status.startTime",
        "valid datetime",
    ),
    (
        "long job name",
        "  name: react-toy\n",
        "  name: " + "r" * 64 + MARK + "\n",
        "metadata.name",
        "has 64 characters; a RolloutJob name has at most 63",
    ),
    (
        "bad object name",
        "  name: react\n",
        "  name: React_1" + MARK + "\n",
        "metadata.name",
        "does not match the pattern",
    ),
    (
        "no name",
        "metadata:\n  name: react\n",
        "metadata:" + MARK + "\n  labels: {a: b}\n",
        "metadata.name",
        "required field is missing",
    ),
    (
        "duplicate key",
        "  parallelism: 2",
        "  parallelism: 2\n  parallelism: 3" + MARK,
        "spec.parallelism",
        "duplicate key",
    ),
    (
        "unknown kind",
        "kind: RolloutJob",
        "kind: RolloutJobs" + MARK,
        "kind",
        "unknown kind 'RolloutJobs' (expected HarnessEnv or RolloutJob)",
    ),
    (
        "wrong apiVersion",
        "apiVersion: openforge.dev/v1alpha1\nkind: RolloutJob",
        "apiVersion: openforge.dev/v1" + MARK + "\nkind: RolloutJob",
        "apiVersion",
        "(expected openforge.dev/v1alpha1)",
    ),
]


@pytest.mark.parametrize(
    ("old", "new", "path", "message"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_each_constraint_fails_naming_the_field_and_its_line(
    old: str, new: str, path: str, message: str
) -> None:
    text, line = mutate(old, new)
    with pytest.raises(manifests.ManifestError) as caught:
        load(text)
    problems = caught.value.problems
    assert [problem.path for problem in problems] == [path], str(caught.value)
    (problem,) = problems
    assert problem.line == line, str(problem)
    assert message in str(problem)
    assert str(problem).startswith(f"<string>:{line}: {path}: ")


def test_a_missing_required_field_points_at_the_mapping_that_lacks_it() -> None:
    text, line = mutate("spec:\n  harnessEnvRef", "spec:" + MARK + "\n  harnessEnvRef")
    text = text.replace(
        '  policy: {endpoint: "http://policy:8000/v1", model: tiny, version: 3}\n', ""
    )
    with pytest.raises(manifests.ManifestError) as caught:
        load(text)
    assert str(caught.value) == (
        f"<string>:{line}: spec.policy: required field is missing "
        "(expected a mapping with fields endpoint, model, version)"
    )


def test_every_problem_in_every_document_is_reported_in_order() -> None:
    text = (
        VALID.replace("  api: openai-chat", "  api: 3")
        .replace("  parallelism: 2", "  parallelism: -1")
        .replace("    mode: BaseURL", "    mode: proxy")
    )
    with pytest.raises(manifests.ManifestError) as caught:
        load(text)
    assert [(p.path, p.line) for p in caught.value.problems] == [
        ("spec.api", 6),
        ("spec.capture.mode", 11),
        ("spec.parallelism", VALID.splitlines().index("  parallelism: 2") + 1),
    ]


def test_yaml_syntax_errors_have_a_line() -> None:
    text = VALID.replace("  parallelism: 2", "  parallelism: [2")
    with pytest.raises(manifests.ManifestError, match=r"^<string>:\d+: invalid YAML: "):
        load(text)


def test_a_document_that_is_not_a_mapping() -> None:
    with pytest.raises(
        manifests.ManifestError, match=r"<string>:1: a manifest must be a mapping, got list"
    ):
        load("- a\n- b\n")


def test_two_objects_of_one_kind_with_one_name() -> None:
    job = VALID.split("---\n")[1]
    with pytest.raises(
        manifests.ManifestError,
        match=r"metadata.name: a second RolloutJob named 'react-toy' \(first at line 4\)",
    ):
        load(job + "---\n" + job)


def _minimal_job() -> str:
    return (
        "apiVersion: openforge.dev/v1alpha1\nkind: RolloutJob\nmetadata: {name: mini}\n"
        "spec:\n  harnessEnvRef: {name: react}\n  tasks:\n    inline: [{id: a}]\n"
        "  policy: {model: tiny}\n"
    )
