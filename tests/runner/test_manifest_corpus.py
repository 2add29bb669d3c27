"""A corpus of broken manifests and task files: ``openforge run`` refuses every one while
it plans (``plan.load``, before any process starts), naming the file, the line and the
field at fault.

Each case is one change to a good job (a HarnessEnv and a RolloutJob in ``job.yaml``,
tasks in ``tasks.jsonl``) and the start of the message it must get: ``FILE:LINE: FIELD``
for a manifest, ``FILE, line N: FIELD`` for a task file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from openforge.api import manifests
from openforge_runner import plan

ENV = """\
apiVersion: openforge.dev/v1alpha1
kind: HarnessEnv
metadata: {name: echo}
spec:
  api: openai-chat
  baseUrl: {env: [OPENAI_BASE_URL], suffix: /v1}
  template:
    spec:
      containers:
        - name: harness
          image: example/echo:1
          command: [python, -c, "print(1)"]
  task:
    env: {PROMPT: "{{ task.prompt }}"}
    args: [--id, "{{ task.id }}"]
  grader:
    command: [python, grade.py]
    timeoutSeconds: 30
"""
JOB = """\
apiVersion: openforge.dev/v1alpha1
kind: RolloutJob
metadata: {name: demo}
spec:
  harnessEnvRef: {name: echo}
  tasks: {file: tasks.jsonl}
  samplesPerTask: 2
  parallelism: 2
  maxAttemptsPerRollout: 2
  policy: {model: model}
"""
TASKS = '{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": "yo"}\n'
LAUGHS = "lol0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"lol{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 10)
)
"""Ten levels of ten aliases: 10**10 nodes once expanded, in ten lines."""
INLINE = JOB.replace(
    "tasks: {file: tasks.jsonl}", "tasks:\n    inline:\n      - {id: a, prompt: hi}"
)


def lines(count: int, size: int = 10) -> str:
    return "".join(json.dumps({"id": f"t{i}", "prompt": "x" * size}) + "\n" for i in range(count))


# name: (HarnessEnv text, RolloutJob text, tasks.jsonl content, the message's start as a regex)
CASES: dict[str, tuple[str, str, str | bytes, str]] = {
    # the RolloutJob's fields
    "samplesPerTask a string": (
        ENV, JOB.replace("samplesPerTask: 2", "samplesPerTask: two"), TASKS,
        r"job.yaml:@samplesPerTask:@: spec.samplesPerTask: input should be a valid integer",
    ),
    "samplesPerTask zero": (
        ENV, JOB.replace("samplesPerTask: 2", "samplesPerTask: 0"), TASKS,
        r"job.yaml:@samplesPerTask:@: spec.samplesPerTask: .*>= 1",
    ),
    "samplesPerTask a hundred million": (
        ENV, JOB.replace("samplesPerTask: 2", "samplesPerTask: 100000000"), TASKS,
        r"job.yaml:@samplesPerTask:@: spec.samplesPerTask: .*<= 4096",
    ),
    "parallelism zero": (
        ENV, JOB.replace("parallelism: 2", "parallelism: 0"), TASKS,
        r"job.yaml:@parallelism:@: spec.parallelism: ",
    ),
    "a misspelt field": (
        ENV, JOB.replace("parallelism: 2", "paralelism: 2"), TASKS,
        r"job.yaml:@paralelism:@: spec.paralelism: .*parallelism",
    ),
    "maxAttemptsPerRollout zero": (
        ENV, JOB.replace("maxAttemptsPerRollout: 2", "maxAttemptsPerRollout: 0"), TASKS,
        r"job.yaml:@maxAttemptsPerRollout:@: spec.maxAttemptsPerRollout: ",
    ),
    "a negative timeout": (
        ENV, JOB.replace("  policy:", "  rolloutTimeoutSeconds: -1\n  policy:"), TASKS,
        r"job.yaml:@rolloutTimeoutSeconds:@: spec.rolloutTimeoutSeconds: ",
    ),
    "a boolean where a number goes": (
        ENV, JOB.replace("parallelism: 2", "parallelism: true"), TASKS,
        r"job.yaml:@parallelism:@: spec.parallelism: ",
    ),
    "no harnessEnvRef": (
        ENV, JOB.replace("  harnessEnvRef: {name: echo}\n", ""), TASKS,
        r"job.yaml:\d+: spec.harnessEnvRef: required field is missing",
    ),
    "a harnessEnvRef to nothing": (
        ENV, JOB.replace("name: echo}", "name: ecko}"), TASKS,
        r"job.yaml:@harnessEnvRef:@: spec.harnessEnvRef.name: no HarnessEnv named 'ecko'"
        r".*did you mean 'echo'",
    ),
    "two task sources": (
        ENV,
        JOB.replace("tasks: {file: tasks.jsonl}", "tasks: {file: tasks.jsonl, inline: [{id: a}]}"),
        TASKS,
        r"job.yaml:@tasks:@: spec.tasks: set exactly one",
    ),
    "a task file that is not there": (
        ENV, JOB.replace("tasks.jsonl", "nope.jsonl"), TASKS,
        r"job.yaml: spec.tasks.file: nope.jsonl does not exist",
    ),
    "a ConfigMap locally": (
        ENV,
        JOB.replace("tasks: {file: tasks.jsonl}", "tasks: {configMapRef: {name: t, key: k}}"),
        TASKS,
        r"job.yaml: spec.tasks.configMapRef: a ConfigMap exists only on a cluster",
    ),
    "a policy model that is a number": (
        ENV, JOB.replace("model: model", "model: 7"), TASKS,
        r"job.yaml:@policy:@: spec.policy.model: ",
    ),
    "a failure rule with two matchers": (
        ENV,
        JOB.replace(
            "  policy:",
            "  failurePolicy: {rules: [{action: Retry, onReasons: [Evicted], "
            "onExitCodes: {operator: In, values: [1]}}]}\n  policy:",
        ),
        TASKS,
        r"job.yaml:@failurePolicy:@: spec.failurePolicy.rules\[0\]: .*exactly one",
    ),
    "a failure rule with an unknown action": (
        ENV,
        JOB.replace(
            "  policy:",
            "  failurePolicy: {rules: [{action: Sometimes, onReasons: [Evicted]}]}\n  policy:",
        ),
        TASKS,
        r"job.yaml:@failurePolicy:@: spec.failurePolicy.rules\[0\].action: ",
    ),
    "an unknown kind": (
        ENV, JOB.replace("kind: RolloutJob", "kind: RolloutJobs"), TASKS,
        r"job.yaml:\d+: kind: ",
    ),
    "a wrong apiVersion": (
        ENV, JOB.replace("openforge.dev/v1alpha1", "openforge.dev/v1"), TASKS,
        r"job.yaml:\d+: apiVersion: ",
    ),
    "a duplicate key": (
        ENV, JOB.replace("parallelism: 2", "parallelism: 2\n  parallelism: 3"), TASKS,
        r"job.yaml:@parallelism: 3@: spec.parallelism: duplicate key",
    ),
    "a second HarnessEnv of the same name": (
        ENV + "---\n" + ENV, JOB, TASKS,
        r"job.yaml:\d+: metadata.name: a second HarnessEnv named 'echo'",
    ),
    # the HarnessEnv's fields
    "an unknown wire API": (
        ENV.replace("api: openai-chat", "api: openai-chatt"), JOB, TASKS,
        r"job.yaml:@api:@: spec.api: ",
    ),
    "a grader timeout of zero": (
        ENV.replace("timeoutSeconds: 30", "timeoutSeconds: 0"), JOB, TASKS,
        r"job.yaml:@timeoutSeconds:@: spec.grader.timeoutSeconds: ",
    ),
    "an unknown rewardFrom": (
        ENV.replace("timeoutSeconds: 30", "timeoutSeconds: 30\n    rewardFrom: vibes"), JOB, TASKS,
        r"job.yaml:@rewardFrom:@: spec.grader.rewardFrom: ",
    ),
    "a base URL variable that is no name": (
        ENV.replace("env: [OPENAI_BASE_URL]", "env: ['1 BAD']"), JOB, TASKS,
        r"job.yaml:@baseUrl:@: spec.baseUrl.env",
    ),
    "no command to run locally": (
        ENV.replace('          command: [python, -c, "print(1)"]\n', ""), JOB, TASKS,
        r"job.yaml: spec.template: .*needs a command to run locally",
    ),
    "a task env naming a field a task lacks": (
        ENV.replace("{{ task.prompt }}", "{{ task.question }}"), JOB, TASKS,
        r"job.yaml:@PROMPT@: spec.task.env.PROMPT: task 'a' has no field task.question",
    ),
    "a task arg naming a field a task lacks": (
        ENV.replace('"{{ task.id }}"', '"{{ task.meta.level }}"'), JOB, TASKS,
        r"job.yaml:@args:@: spec.task.args.1: task 'a' has no field task.meta",
    ),
    "a field only the second task lacks": (
        ENV, JOB, '{"id": "a", "prompt": "hi"}\n{"id": "b"}\n',
        r"job.yaml:@PROMPT@: spec.task.env.PROMPT: task 'b' has no field task.prompt",
    ),
    "an unclosed placeholder": (
        ENV.replace("{{ task.prompt }}", "{{ task.prompt"), JOB, TASKS,
        r"job.yaml:\d+: spec.task.env.PROMPT: .*unclosed placeholder",
    ),
    "a task file template naming a missing field": (
        ENV.replace(
            "  grader:", '    file: {path: t.json, template: \'{"q": {{ task.q }}}\'}\n  grader:'
        ),
        JOB,
        TASKS,
        r"job.yaml:@file:@: spec.task.file.template: task 'a' has no field task.q",
    ),
    # YAML itself
    "a billion laughs": (
        ENV, JOB + LAUGHS, TASKS,
        r"job.yaml:20: the document's aliases expand it to more than 1000000 nodes",
    ),
    "an alias inside its own anchor": (
        ENV, JOB + "loop: &loop [*loop]\n", TASKS,
        r"job.yaml:\d+: (invalid YAML|the document's aliases expand it)",
    ),
    "a YAML syntax error": (
        ENV, JOB.replace("parallelism: 2", "parallelism: [2"), TASKS,
        r"job.yaml:\d+: invalid YAML",
    ),
    # inline tasks
    "an inline task without an id": (
        ENV, INLINE.replace("{id: a, prompt: hi}", "{prompt: hi}"), TASKS,
        r"job.yaml:@- {@: spec.tasks.inline\[0\].id: required field is missing",
    ),
    "an inline id with a space": (
        ENV, INLINE.replace("{id: a, prompt: hi}", "{id: 'a b', prompt: hi}"), TASKS,
        r"job.yaml:@- {@: spec.tasks.inline\[0\].id: ",
    ),
    "an inline id that is shell code": (
        ENV,
        INLINE.replace("{id: a, prompt: hi}", "{id: '$(touch /tmp/pwned)', prompt: hi}"),
        TASKS,
        r"job.yaml:@- {@: spec.tasks.inline\[0\].id: ",
    ),
    "an inline id of 254 characters": (
        ENV, INLINE.replace("{id: a, prompt: hi}", "{id: " + "a" * 254 + ", prompt: hi}"), TASKS,
        r"job.yaml:@- {@: spec.tasks.inline\[0\].id: ",
    ),
    "an inline task of 200 kB": (
        ENV, INLINE.replace("prompt: hi}", "prompt: " + "x" * 200_000 + "}"), TASKS,
        r"job.yaml:@- {@: spec.tasks.inline\[0\]: the task is 200\d+ bytes as JSON; "
        r"a task holds at most 100000",
    ),
    "10001 inline tasks": (
        ENV,
        INLINE.replace(
            "      - {id: a, prompt: hi}\n",
            "".join(f"      - {{id: t{i}}}\n" for i in range(10001)),
        ),
        TASKS,
        r"job.yaml:@inline:@: spec.tasks.inline: .*at most 10000",
    ),
    # task files
    "a task line that is not JSON": (
        ENV, JOB, '{"id": "a", "prompt": "hi"}\n{bad\n',
        r"job.yaml: spec.tasks.file: .*tasks.jsonl, line 2: not JSON",
    ),
    "a task line that is a list": (
        ENV, JOB, '[1, 2]\n',
        r"job.yaml: spec.tasks.file: .*tasks.jsonl, line 1: "
        r"a task is a JSON object with an id, not list",
    ),
    "a task with an empty id": (
        ENV, JOB, '{"id": "", "prompt": "hi"}\n',
        r"job.yaml: spec.tasks.file: .*tasks.jsonl, line 1: "
        r"id: every task needs a non-empty string id",
    ),
    "a task id with a semicolon": (
        ENV, JOB, '{"id": "a;rm -rf /", "prompt": "hi"}\n',
        r"job.yaml: spec.tasks.file: .*tasks.jsonl, line 1: "
        r"id: 'a;rm -rf /' has a character ids may not",
    ),
    "a task id that is a number": (
        ENV, JOB, '{"id": 7, "prompt": "hi"}\n',
        r"job.yaml: spec.tasks.file: .*tasks.jsonl, line 1: id: ",
    ),
    "a duplicate task id": (
        ENV, JOB, TASKS + '{"id": "a", "prompt": "again"}\n',
        r"job.yaml: spec.tasks.file: .*tasks.jsonl, line 3: id: 'a' is already the id of line 1",
    ),
    "10001 tasks in a file": (
        ENV, JOB, lines(10001),
        r"job.yaml: spec.tasks.file: .*tasks.jsonl, line 10001: more than 10000 tasks",
    ),
    "a task of 200 kB in a file": (
        ENV, JOB, lines(1, 200_000),
        r"job.yaml: spec.tasks.file: .*tasks.jsonl, line 1: the task is 200\d+ bytes as JSON",
    ),
    "a task file that is not UTF-8": (
        ENV, JOB, b'{"id": "a", "prompt": "caf\xe9"}\n',
        r"job.yaml: spec.tasks.file: .*tasks.jsonl is not UTF-8 text \(at byte offset 26\)",
    ),
    "a task file of blank lines": (
        ENV, JOB, "\n\n  \n",
        r"job.yaml: spec.tasks.file: .*tasks.jsonl: holds no task",
    ),
    "too many rollouts": (
        ENV, JOB.replace("samplesPerTask: 2", "samplesPerTask: 4000"), lines(300),
        r"job.yaml:@samplesPerTask:@: spec.samplesPerTask: "
        r"300 tasks x 4000 samples is 1200000 rollouts; a job runs at most 1000000",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_a_broken_manifest_is_refused_while_planning_naming_file_line_and_field(
    tmp_path: Path, case: str
) -> None:
    env, job, tasks, message = CASES[case]
    path = tmp_path / "job.yaml"
    path.write_text(env + "---\n" + job)
    task_file = tmp_path / "tasks.jsonl"
    if isinstance(tasks, bytes):
        task_file.write_bytes(tasks)
    else:
        task_file.write_text(tasks)
    with pytest.raises((plan.PlanError, manifests.ManifestError)) as refused:
        plan.load([path])
    text = path.read_text().splitlines()
    # @TEXT@ stands for the number of the first line of job.yaml that holds TEXT
    pattern = re.sub(
        "@(.+?)@",
        lambda m: str(1 + next(i for i, line in enumerate(text) if m[1] in line)),
        message,
    )
    assert any(
        re.search(f"^{re.escape(str(tmp_path))}/{pattern}", line)
        for line in str(refused.value).splitlines()
    ), (pattern, str(refused.value)[:2000])


def test_the_good_job_plans_and_the_corpus_holds_forty_cases(tmp_path: Path) -> None:
    assert len(CASES) >= 40
    path = tmp_path / "job.yaml"
    path.write_text(ENV + "---\n" + JOB)
    (tmp_path / "tasks.jsonl").write_text(TASKS)
    bundle = plan.load([path])
    assert [task["id"] for task in bundle.tasks] == ["a", "b"]


def test_a_manifest_file_over_four_mib_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(ENV + "---\n" + JOB + "# " + "x" * manifests.MAX_BYTES + "\n")
    with pytest.raises(
        manifests.ManifestError,
        match=(
            rf"^{tmp_path}/job.yaml: the file is \d+ bytes; a manifest file holds at most 4194304"
        ),
    ):
        plan.load([path])


def test_a_manifest_that_is_not_utf8_names_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes((ENV + "---\n" + JOB).encode().replace(b"name: demo", b"name: d\xffmo"))
    with pytest.raises(
        manifests.ManifestError,
        match=rf"^{tmp_path}/job.yaml:22: not UTF-8 text \(at byte offset \d+\)",
    ):
        plan.load([path])
