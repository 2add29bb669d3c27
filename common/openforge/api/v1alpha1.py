"""The ``openforge.dev/v1alpha1`` API: HarnessEnv and RolloutJob.

These models are the single source of truth for both kinds. The operator
validates each object it reconciles with them, ``openforge run`` validates the
same YAML with them on one machine, and the CRDs in ``crds/`` are generated
from their JSON schema (``openforge.api.crds``).

Field names are snake_case in Python and camelCase in YAML (aliases). Python
code may construct models with either; manifests and API objects go through
``openforge.api.manifests`` (``load_manifests``, ``parse``), which accepts
camelCase only, as the API server does. Unknown fields are errors (``extra="forbid"``), and
values are not coerced (``strict``): ``samplesPerTask: "4"`` is rejected here
exactly as the API server rejects it. Two parts of a Kubernetes object are
modelled only as far as OpenForge reads them and keep everything else: the
pod template (``PodTemplate``) and each inline task record (``TaskRecord``).

A check that spans fields raises :func:`field_error`, whose context names the
field at fault below the validator's own location, so a message can point at
``spec.baseUrl`` (and its line in the file) rather than at ``spec``.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, ClassVar, Final, Literal

import pydantic
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from openforge.api import rollouts, templates

GROUP = "openforge.dev"
VERSION = "v1alpha1"
API_VERSION: Final = "openforge.dev/v1alpha1"

HARNESS_CONTAINER = "harness"
"""The pod template's container that runs the harness (and, after it, the grader)."""

WireApi = Literal["openai-chat", "openai-responses", "anthropic-messages", "gemini"]
CaptureMode = Literal["BaseURL", "Proxy", "Transparent"]
RewardFrom = Literal["stdout-json", "exit-code"]
FailureAction = Literal["Retry", "FailRollout", "Ignore"]
TrainingEngine = Literal["openforge", "verl"]
FailureReason = Literal[
    "Evicted",
    "OOMKilled",
    "DeadlineExceeded",
    "Preempted",
    "ImagePullFailed",
    "SidecarFailed",
    "GraderFailed",
]
"""Why an attempt ended, as reported by the operator or ``openforge run``.

Evicted: the node evicted the pod. OOMKilled: a container ran out of memory.
DeadlineExceeded: the attempt outlived its rollout timeout. Preempted: a
higher-priority pod took its place. ImagePullFailed: an image could not be
pulled. SidecarFailed: the capture sidecar exited or could not record.
GraderFailed: the grader exited non-zero, timed out, or printed no reward.
"""

ConditionStatus = Literal["True", "False", "Unknown"]

# Condition types.
READY = "Ready"
SUSPENDED = "Suspended"
COMPLETE = "Complete"
FAILED = "Failed"

_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_CONDITION_REASON = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
_HOST_PORT = r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?):[0-9]{1,5}$"
_HTTP_URL = r"^https?://[^\s/]+(/\S*)?$"
TASK_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
"""A task id: letters, digits, ``.``, ``_`` and ``-``, a letter or digit first. Ids name
files and Kubernetes annotations and reach commands, where a quote, a space or a ``$``
would be shell code."""
MAX_TASK_ID = 253
MAX_TASKS = 10000
"""Tasks per job, from any source."""
MAX_SAMPLES_PER_TASK = 4096

ExitCode = Annotated[int, pydantic.Field(ge=0, le=255)]

# Kubernetes reads a timestamp from a string; strict mode alone would not.
Timestamp = Annotated[datetime, pydantic.Strict(False)]


def field_error(
    path: tuple[str | int, ...], message: str, *, expected: str | None = None
) -> PydanticCustomError:
    """A validation error about the field ``path`` below the validator's location.

    Plain ``str(error)`` shows ``path`` before the message; the context keeps
    them apart for ``openforge.api.manifests``, which joins ``path`` to the
    location and finds its line.
    """
    relative = ".".join(f"[{part}]" if isinstance(part, int) else part for part in path).replace(
        ".[", "["
    )
    shown = f"{relative}: {message}" if relative else message
    return PydanticCustomError(
        "openforge",
        "{shown}",
        {"shown": shown, "message": message, "path": path, "expected": expected},
    )


def _immutable(field: str, why: str = "") -> dict[str, Any]:
    message = f"{field} is immutable" + (f" ({why})" if why else "")
    return {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": message}]}


class Model(pydantic.BaseModel):
    """Base of every API model: camelCase aliases, unknown fields rejected, no coercion."""

    model_config = pydantic.ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True
    )

    def to_dict(self) -> dict[str, Any]:
        """The object as Kubernetes YAML/JSON has it: camelCase, unset fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class OpenModel(Model):
    """A part of a Kubernetes object we read only in part: other fields are kept as they are."""

    model_config = pydantic.ConfigDict(extra="allow")


# -- envelope ---------------------------------------------------------------------------


class ObjectMeta(Model):
    """Standard Kubernetes object metadata."""

    name: str | None = pydantic.Field(default=None, max_length=253, pattern=_DNS_SUBDOMAIN)
    generate_name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: Timestamp | None = None
    deletion_timestamp: Timestamp | None = None
    deletion_grace_period_seconds: int | None = None
    owner_references: list[dict[str, Any]] | None = None
    finalizers: list[str] | None = None
    managed_fields: list[dict[str, Any]] | None = None
    self_link: str | None = None

    @pydantic.model_validator(mode="after")
    def _named(self) -> ObjectMeta:
        if self.name is None and self.generate_name is None:
            raise field_error(
                ("name",),
                "required field is missing",
                expected="a DNS subdomain name (or generateName)",
            )
        return self


class Condition(Model):
    """One standard Kubernetes condition (metav1.Condition)."""

    type: str = pydantic.Field(
        min_length=1, max_length=316, description="Condition type, e.g. Ready."
    )
    status: ConditionStatus
    reason: str = pydantic.Field(
        min_length=1, max_length=1024, pattern=_CONDITION_REASON, description="CamelCase reason."
    )
    message: str = pydantic.Field(
        default="", max_length=32768, description="Human-readable detail."
    )
    last_transition_time: Timestamp = pydantic.Field(description="When status last changed.")
    observed_generation: int | None = pydantic.Field(
        default=None, ge=0, description="The .metadata.generation the condition was set for."
    )


def set_condition(conditions: list[Condition], condition: Condition) -> list[Condition]:
    """Conditions with ``condition`` in place of its type's; keep the transition time if status
    held.

    Like apimachinery's ``meta.SetStatusCondition``: ``lastTransitionTime``
    moves only when the status changes.
    """
    for old in conditions:
        if old.type == condition.type and old.status == condition.status:
            condition = condition.model_copy(
                update={"last_transition_time": old.last_transition_time}
            )
    return [old for old in conditions if old.type != condition.type] + [condition]


def find_condition(conditions: list[Condition], type_: str) -> Condition | None:
    """The condition of this type, if set."""
    return next((condition for condition in conditions if condition.type == type_), None)


_CONDITIONS_LIST: dict[str, Any] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}


# -- HarnessEnv ---------------------------------------------------------------------------


class EnvVar(OpenModel):
    """A container env entry; ``valueFrom`` and the like are kept for the cluster."""

    name: str
    value: str | None = None


class Container(OpenModel):
    """A pod template container, read only for what ``openforge run`` needs."""

    name: str
    image: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[EnvVar] | None = None
    working_dir: str | None = None


class PodSpec(OpenModel):
    """The pod spec of the template: its containers must include the harness."""

    containers: list[Container] = pydantic.Field(min_length=1)

    @pydantic.field_validator("containers")
    @classmethod
    def _one_harness(cls, containers: list[Container]) -> list[Container]:
        found = [i for i, container in enumerate(containers) if container.name == HARNESS_CONTAINER]
        if len(found) != 1:
            names = [container.name for container in containers]
            raise field_error(
                (),
                f"must hold exactly one container named {HARNESS_CONTAINER!r}, got {names}",
                expected=f"one container named {HARNESS_CONTAINER!r}",
            )
        harness = containers[found[0]]
        if harness.image is None and not harness.command:
            raise field_error(
                (found[0],),
                f"the {HARNESS_CONTAINER!r} container needs an image, a command, or both",
                expected="image (cluster) and/or command (local)",
            )
        return containers


class PodTemplate(OpenModel):
    """A Kubernetes PodTemplateSpec (metadata + spec), kept whole."""

    metadata: dict[str, Any] | None = None
    spec: PodSpec


class LocalOverrides(Model):
    """How openforge run starts the harness as a local process instead of a container: \
each field set here replaces the harness container's (env is merged over it), a field left out \
falls back to the container's."""

    command: list[str] | None = pydantic.Field(
        default=None, min_length=1, description="Executable and leading arguments."
    )
    args: list[str] | None = pydantic.Field(
        default=None, description="Arguments after the command."
    )
    env: dict[str, str] | None = pydantic.Field(
        default=None, description="Environment, merged over the container's."
    )
    working_dir: str | None = pydantic.Field(
        default=None,
        description="Working directory of the process, relative to the rollout's own directory "
        "(the default; the container's workingDir is not used locally).",
    )

    @pydantic.field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str] | None) -> dict[str, str] | None:
        return _check_env_names(env)


class TaskFile(Model):
    """Write the task record to a file in the harness's filesystem before it starts."""

    path: str = pydantic.Field(
        min_length=1, description="Where to write (absolute, or relative to the working directory)."
    )
    format: Literal["json", "text"] = pydantic.Field(
        default="json",
        description=(
            "json: placeholders render as JSON values; no template writes the whole record. "
            "text: placeholders render as text; a template is required."
        ),
    )
    template: str | None = pydantic.Field(
        default=None, description="File contents, with {{ task.<field> }} placeholders."
    )

    @pydantic.field_validator("template")
    @classmethod
    def _parses(cls, template: str | None) -> str | None:
        if template is not None:
            _check_template((), template)
        return template

    @pydantic.model_validator(mode="after")
    def _text_needs_template(self) -> TaskFile:
        if self.format == "text" and self.template is None:
            raise field_error(("template",), "required when format is text", expected="a string")
        return self


class TaskDelivery(Model):
    """How each task record reaches the harness: env vars, extra args, and/or a file."""

    env: dict[str, str] | None = pydantic.Field(
        default=None, description="Env var name -> template, e.g. PROMPT: '{{ task.prompt }}'."
    )
    args: list[str] | None = pydantic.Field(
        default=None, description="Templates appended to the harness's arguments."
    )
    file: TaskFile | None = None

    @pydantic.field_validator("env")
    @classmethod
    def _env_templates(cls, env: dict[str, str] | None) -> dict[str, str] | None:
        for name, template in (_check_env_names(env) or {}).items():
            _check_template((name,), template)
        return env

    @pydantic.field_validator("args")
    @classmethod
    def _arg_templates(cls, args: list[str] | None) -> list[str] | None:
        for i, template in enumerate(args or []):
            _check_template((i,), template)
        return args


class BaseUrl(Model):
    """Which env vars point the harness at the sidecar (capture mode BaseURL)."""

    env: list[str] = pydantic.Field(
        min_length=1,
        description="Env vars that set the harness's API base URL, e.g. OPENAI_BASE_URL.",
    )
    suffix: str = pydantic.Field(default="", description="Appended to the sidecar URL, e.g. /v1.")

    @pydantic.field_validator("env")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        for i, name in enumerate(names):
            if not _ENV_NAME.match(name):
                raise field_error(
                    (i,), f"{name!r} is not an env var name", expected="a C identifier-like name"
                )
        return names

    @pydantic.field_validator("suffix")
    @classmethod
    def _path(cls, suffix: str) -> str:
        if suffix and not suffix.startswith("/"):
            raise field_error(
                (), f"must start with '/', got {suffix!r}", expected="a URL path like /v1"
            )
        return suffix


class Capture(Model):
    """How the harness's model traffic is routed through the capture sidecar."""

    mode: CaptureMode = pydantic.Field(
        default="BaseURL",
        description="BaseURL: set the harness's base-URL env vars to the sidecar. Proxy: set "
        "HTTP(S)_PROXY and trust the sidecar's CA. Transparent: redirect egress with iptables.",
    )
    allowed_hosts: list[str] = pydantic.Field(
        default=[], description="Hosts the rollout pod may reach besides the policy route."
    )
    sidecar_image: str | None = pydantic.Field(
        default=None, description="Sidecar image; the operator's default if unset."
    )


class Grader(Model):
    """Scores a finished rollout; runs after the harness exits, in the harness's environment."""

    command: list[str] = pydantic.Field(min_length=1, description="Executable and arguments.")
    timeout_seconds: int = pydantic.Field(
        default=300, ge=1, description="Kill the grader after this long."
    )
    reward_from: RewardFrom = pydantic.Field(
        default="stdout-json",
        description='stdout-json: the last stdout line is JSON with a numeric "reward". '
        "exit-code: exit 0 is reward 1.0, anything else 0.0.",
    )


class HarnessEnvSpec(Model):
    """A harness, packaged to run rollouts: its pod, its task input, its model API, its grader."""

    template: PodTemplate = pydantic.Field(
        description=(
            f"Pod template; spec.containers must hold one container named {HARNESS_CONTAINER!r}."
        ),
        json_schema_extra={"x-openforge-opaque": True},
    )
    local: LocalOverrides | None = None
    task: TaskDelivery = pydantic.Field(default_factory=TaskDelivery)
    api: WireApi = pydantic.Field(description="The model API the harness speaks.")
    base_url: BaseUrl | None = None
    capture: Capture = pydantic.Field(default_factory=Capture)
    grader: Grader | None = None
    timeout_seconds: int | None = pydantic.Field(
        default=None,
        ge=1,
        description="Default rollout timeout; a RolloutJob's rolloutTimeoutSeconds wins.",
    )

    @pydantic.model_validator(mode="after")
    def _base_url_for_mode(self) -> HarnessEnvSpec:
        if self.capture.mode == "BaseURL" and self.base_url is None:
            raise field_error(
                ("baseUrl",),
                "required when capture.mode is BaseURL",
                expected="{env: [ENV_VAR, ...], suffix: /v1}",
            )
        return self

    def harness_container(self) -> Container:
        """The template's harness container (validation guarantees exactly one)."""
        return next(c for c in self.template.spec.containers if c.name == HARNESS_CONTAINER)

    def local_process(self) -> LocalProcess:
        """What ``openforge run`` starts: the harness container's command, env and args,
        each replaced by ``local`` where it sets them (``env`` merged)."""
        container = self.harness_container()
        local = self.local or LocalOverrides()
        command = local.command or container.command
        if not command:
            raise ValueError(
                "HarnessEnv needs a command to run locally: set spec.local.command or the "
                f"{HARNESS_CONTAINER!r} container's command "
                "(a container image's entrypoint is not known locally)"
            )
        env: dict[str, str] = {}
        for var in container.env or []:
            if var.value is None:
                raise ValueError(
                    f"env var {var.name} of the {HARNESS_CONTAINER!r} container has no plain value "
                    "(valueFrom works only in a cluster); set it in spec.local.env"
                )
            env[var.name] = var.value
        env.update(local.env or {})
        args = local.args if local.args is not None else container.args or []
        # locally the rollout's own directory plays the container's working
        # directory: an image path such as /work means nothing on this machine
        return LocalProcess(argv=[*command, *args], env=env, working_dir=local.working_dir)


class LocalProcess(pydantic.BaseModel):
    """A harness process to start on this machine (before task args are appended)."""

    model_config = pydantic.ConfigDict(frozen=True)

    argv: list[str]
    env: dict[str, str]
    working_dir: str | None


class HarnessEnvStatus(Model):
    """What the operator last observed of a HarnessEnv."""

    observed_generation: int | None = pydantic.Field(default=None, ge=0)
    conditions: list[Condition] = pydantic.Field(default=[], json_schema_extra=_CONDITIONS_LIST)


class HarnessEnv(Model):
    """A harness packaged for rollouts: what runs, how tasks and the model reach it, \
how it is graded."""

    KIND: ClassVar[str] = "HarnessEnv"
    PLURAL: ClassVar[str] = "harnessenvs"

    api_version: Literal["openforge.dev/v1alpha1"] = API_VERSION
    kind: Literal["HarnessEnv"] = "HarnessEnv"
    metadata: ObjectMeta
    spec: HarnessEnvSpec
    status: HarnessEnvStatus | None = None


# -- RolloutJob ---------------------------------------------------------------------------


class LocalObjectReference(Model):
    """A reference to an object in the same namespace."""

    name: str = pydantic.Field(min_length=1, max_length=253)


class KeySelector(Model):
    """A key of a ConfigMap or Secret in the same namespace."""

    name: str = pydantic.Field(min_length=1, max_length=253)
    key: str = pydantic.Field(min_length=1, max_length=253)


class TaskRecord(OpenModel):
    """One task: an id plus any fields the harness and grader read."""

    id: str = pydantic.Field(
        min_length=1, max_length=MAX_TASK_ID, pattern=TASK_ID_PATTERN,
        description="Unique within the job: letters, digits, '.', '_' and '-',"
        " a letter or digit first.",
    )  # fmt: skip


_ONE_TASK_SOURCE = "set exactly one of inline, configMapRef, file"


class TaskSource(Model):
    """Where the job's task records come from; exactly one source."""

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": (
                        "[has(self.inline), has(self.configMapRef), has(self.file)]"
                        ".exists_one(x, x)"
                    ),
                    "message": "set exactly one of tasks.inline, tasks.configMapRef, tasks.file",
                }
            ]
        }
    )

    inline: list[TaskRecord] | None = pydantic.Field(
        default=None, min_length=1, max_length=MAX_TASKS, description="The records themselves."
    )
    config_map_ref: KeySelector | None = pydantic.Field(
        default=None, description="A ConfigMap key holding JSON Lines, one record per line."
    )
    file: str | None = pydantic.Field(
        default=None, min_length=1, description="A JSON Lines file (openforge run only)."
    )

    @pydantic.model_validator(mode="after")
    def _one_source(self) -> TaskSource:
        given = [
            name
            for name in ("inline", "configMapRef", "file")
            if getattr(self, _snake(name)) is not None
        ]
        if len(given) != 1:
            raise field_error((), f"{_ONE_TASK_SOURCE}, got {given or 'none'}")
        return self

    @pydantic.field_validator("inline")
    @classmethod
    def _unique_ids(cls, records: list[TaskRecord] | None) -> list[TaskRecord] | None:
        seen: dict[str, int] = {}
        for i, record in enumerate(records or []):
            if record.id in seen:
                raise field_error(
                    (i, "id"), f"id {record.id!r} is already the id of item {seen[record.id]}"
                )
            seen[record.id] = i
        return records


class ExitCodes(Model):
    """Matches an attempt by the harness's exit code."""

    operator: Literal["In", "NotIn"]
    values: list[ExitCode] = pydantic.Field(min_length=1, max_length=255)

    def matches(self, exit_code: int) -> bool:
        return (exit_code in self.values) == (self.operator == "In")


class FailureRule(Model):
    """What to do with a failed attempt that matches; set exactly one of onExitCodes, onReasons."""

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.onExitCodes) != has(self.onReasons)",
                    "message": "set exactly one of onExitCodes, onReasons",
                }
            ]
        }
    )

    action: FailureAction = pydantic.Field(
        description="Retry: run another attempt (up to maxAttemptsPerRollout). FailRollout: give "
        "the rollout up now. Ignore: retry without counting the attempt."
    )
    on_exit_codes: ExitCodes | None = None
    on_reasons: list[FailureReason] | None = pydantic.Field(default=None, min_length=1)

    @pydantic.model_validator(mode="after")
    def _one_matcher(self) -> FailureRule:
        if (self.on_exit_codes is None) == (self.on_reasons is None):
            raise field_error((), "set exactly one of onExitCodes, onReasons")
        return self

    def matches(self, *, exit_code: int | None, reason: str | None) -> bool:
        if self.on_exit_codes is not None:
            return exit_code is not None and self.on_exit_codes.matches(exit_code)
        return reason is not None and reason in (self.on_reasons or [])


class FailurePolicy(Model):
    """Rules for failed attempts, first match wins; an attempt no rule matches is retried."""

    rules: list[FailureRule] = pydantic.Field(default=[], max_length=20)

    def action_for(self, *, exit_code: int | None, reason: str | None) -> FailureAction:
        """The action for a failed attempt: the first matching rule's, else Retry."""
        for rule in self.rules:
            if rule.matches(exit_code=exit_code, reason=reason):
                return rule.action
        return "Retry"


class Policy(Model):
    """The policy under training, as the sidecar reaches it."""

    endpoint: str | None = pydantic.Field(
        default=None,
        pattern=_HTTP_URL,
        description="Inference base URL (token-in/token-out). The operator requires it; "
        "openforge run starts `openforge serve` when it is absent.",
    )
    model: str = pydantic.Field(
        min_length=1, description="Model name sent to the inference server."
    )
    version: int = pydantic.Field(
        default=0, ge=0, description="Policy version stamped on each record."
    )


class Trainer(Model):
    """Where the sidecars stream trajectory records."""

    endpoint: str = pydantic.Field(
        pattern=_HOST_PORT, description="Collector gRPC address, host:port."
    )
    token_secret_ref: KeySelector | None = pydantic.Field(
        default=None,
        description="Secret key holding the collector's bearer token; unset, an operator with a"
        " collector master key issues the job its own (Secret <job>-collector-token).",
    )


class Training(Model):
    """Trainer settings for `openforge run` and the trainer Deployment; \
unset ones keep the trainer's defaults."""

    iterations: int | None = pydantic.Field(
        default=None, ge=1, description="Optimiser steps in total."
    )
    groups_per_step: int | None = pydantic.Field(
        default=None, ge=1, description="Task groups per step."
    )
    learning_rate: float | None = pydantic.Field(
        default=None, gt=0, description="AdamW learning rate."
    )
    seed: int | None = None
    kl_coef: float | None = pydantic.Field(
        default=None, ge=0, description="KL-to-reference weight."
    )
    max_staleness: int | None = pydantic.Field(
        default=None, ge=0, description="Skip groups sampled more than this many versions ago."
    )
    engine: TrainingEngine = pydantic.Field(
        default="openforge",
        description="openforge: `openforge train` (one process). verl: veRL's Ray trainer "
        "(`openforge train-verl`, FSDP2 workers); options are then veRL config keys.",
    )
    options: dict[str, Any] | None = pydantic.Field(
        default=None,
        description="Further trainer settings, checked before any rollout runs. engine "
        "openforge: `openforge train` fields by name (e.g. adamEps: 1.0e-5), passed as --option "
        "NAME=VALUE. engine verl: veRL ppo_trainer keys (e.g. trainer.n_gpus_per_node: 8, "
        "trainer.device: cuda), passed as --verl KEY=VALUE.",
    )

    @pydantic.model_validator(mode="after")
    def _engine_fields(self) -> Training:
        if self.engine == "verl" and self.max_staleness is not None:
            raise field_error(
                ("maxStaleness",),
                "engine verl trains each step on that iteration's own rollouts; "
                "maxStaleness is for engine openforge",
            )
        return self


class RolloutJobSpec(Model):
    """Run every task samplesPerTask times in a HarnessEnv, capturing each rollout for training."""

    harness_env_ref: LocalObjectReference = pydantic.Field(
        description="The HarnessEnv to run.", json_schema_extra=_immutable("harnessEnvRef")
    )
    tasks: TaskSource = pydantic.Field(json_schema_extra=_immutable("tasks"))
    samples_per_task: int = pydantic.Field(
        default=1,
        ge=1,
        le=MAX_SAMPLES_PER_TASK,
        description="Rollouts per task: the GRPO group size.",
        json_schema_extra=_immutable("samplesPerTask", "rollout indexes depend on it"),
    )
    parallelism: int = pydantic.Field(
        default=1, ge=1, description="Rollouts running at once; may change while running."
    )
    rollout_timeout_seconds: int | None = pydantic.Field(
        default=None,
        ge=1,
        description="Deadline of one attempt; the HarnessEnv's timeoutSeconds if unset.",
    )
    max_attempts_per_rollout: int = pydantic.Field(
        default=3, ge=1, description="Attempts per rollout, the first included."
    )
    failure_policy: FailurePolicy | None = None
    active_deadline_seconds: int | None = pydantic.Field(
        default=None, ge=1, description="Fail the whole job after this long."
    )
    ttl_seconds_after_finished: int | None = pydantic.Field(
        default=None, ge=0, description="Delete the job this long after it finishes."
    )
    suspend: bool = pydantic.Field(default=False, description="Start no new attempts while true.")
    policy: Policy
    trainer: Trainer | None = pydantic.Field(
        default=None,
        description="The collector; the operator requires it, openforge run starts its own.",
    )
    training: Training | None = None

    def failure_action(self, *, exit_code: int | None, reason: str | None) -> FailureAction:
        """What to do with a failed attempt (Retry when there is no policy or no rule matches)."""
        return (self.failure_policy or FailurePolicy()).action_for(
            exit_code=exit_code, reason=reason
        )


class RolloutCounts(Model):
    """Rollouts by state (each rollout counted once, by its latest attempt)."""

    pending: int = pydantic.Field(default=0, ge=0)
    active: int = pydantic.Field(default=0, ge=0)
    succeeded: int = pydantic.Field(default=0, ge=0)
    failed: int = pydantic.Field(default=0, ge=0)
    retried: int = pydantic.Field(default=0, ge=0, description="Attempts that were retried.")


class RolloutJobStatus(Model):
    """What the operator last observed of a RolloutJob; counts, never per-pod lists."""

    observed_generation: int | None = pydantic.Field(default=None, ge=0)
    conditions: list[Condition] = pydantic.Field(default=[], json_schema_extra=_CONDITIONS_LIST)
    counts: RolloutCounts = pydantic.Field(default_factory=RolloutCounts)
    trajectories_acknowledged: int = pydantic.Field(
        default=0, ge=0, description="Trajectory records the collector has stored durably."
    )
    failed_indexes: str | None = pydantic.Field(
        default=None, description="Indexes of failed rollouts, compact: '1,3-5,9'."
    )
    completed_indexes: str | None = pydantic.Field(
        default=None,
        description=(
            "Indexes of succeeded rollouts, compact: '0-7,9'. With failedIndexes, what the "
            "operator remembers of finished rollouts once their pods are gone."
        ),
    )
    start_time: Timestamp | None = None
    completion_time: Timestamp | None = None

    @pydantic.field_validator("failed_indexes", "completed_indexes")
    @classmethod
    def _compact(cls, text: str | None) -> str | None:
        if text is not None:
            try:
                rollouts.parse_ranges(text)
            except ValueError as error:
                raise field_error(
                    (), str(error), expected="ascending indexes and ranges, e.g. '1,3-5,9'"
                ) from None
        return text


class RolloutJob(Model):
    """A batch of rollouts of one HarnessEnv over a task set, captured for training."""

    KIND: ClassVar[str] = "RolloutJob"
    PLURAL: ClassVar[str] = "rolloutjobs"
    MAX_NAME_LENGTH: ClassVar[int] = 63

    model_config = pydantic.ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "size(self.metadata.name) <= 63",
                    "message": (
                        "a RolloutJob name has at most 63 characters (it labels the rollout pods)"
                    ),
                }
            ]
        }
    )

    api_version: Literal["openforge.dev/v1alpha1"] = API_VERSION
    kind: Literal["RolloutJob"] = "RolloutJob"
    metadata: ObjectMeta
    spec: RolloutJobSpec
    status: RolloutJobStatus | None = None

    @pydantic.field_validator("metadata")
    @classmethod
    def _short_name(cls, metadata: ObjectMeta) -> ObjectMeta:
        if metadata.name is not None and len(metadata.name) > cls.MAX_NAME_LENGTH:
            raise field_error(
                ("name",),
                f"has {len(metadata.name)} characters; a RolloutJob name has at most "
                f"{cls.MAX_NAME_LENGTH} (it labels the rollout pods)",
            )
        return metadata

    def rollout_name(self, index: int, attempt: int) -> str:
        """``<job>-<index>-<attempt>``."""
        if self.metadata.name is None:
            raise ValueError("the RolloutJob has no metadata.name yet")
        return rollouts.rollout_name(self.metadata.name, index, attempt=attempt)


def cluster_problems(job: RolloutJob) -> list[str]:
    """What keeps a valid RolloutJob from running in a cluster (fields only `openforge run` can
    fill)."""
    problems = []
    if job.spec.tasks.file is not None:
        problems.append(
            "spec.tasks.file names a local file; in a cluster use tasks.inline or "
            "tasks.configMapRef"
        )
    if job.spec.policy.endpoint is None:
        problems.append(
            "spec.policy.endpoint is required in a cluster (the inference server's URL)"
        )
    if job.spec.trainer is None:
        problems.append("spec.trainer is required in a cluster (the collector's host:port)")
    return problems


def _snake(alias: str) -> str:
    return re.sub(r"[A-Z]", lambda match: "_" + match[0].lower(), alias)


def _check_env_names(env: dict[str, str] | None) -> dict[str, str] | None:
    for name in env or {}:
        if not _ENV_NAME.match(name):
            raise field_error(
                (name,),
                f"{name!r} is not an env var name",
                expected="letters, digits, '_', '-', '.'",
            )
    return env


def _check_template(path: tuple[str | int, ...], template: str) -> None:
    try:
        templates.references(template)
    except templates.TemplateError as error:
        raise field_error(
            path, str(error), expected="text with {{ task }} or {{ task.<field> }} placeholders"
        ) from None


Resource = HarnessEnv | RolloutJob
KINDS: dict[str, type[HarnessEnv] | type[RolloutJob]] = {
    "HarnessEnv": HarnessEnv,
    "RolloutJob": RolloutJob,
}
