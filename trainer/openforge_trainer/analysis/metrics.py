"""Behaviour metrics of agent episodes: what RL changed in how an agent works.

Pure computation over :class:`~openforge_trainer.analysis.episodes.Episode` values
(``openforge analyze`` reads the store and decodes them). Each metric is
defined precisely in ``docs/analysis.md``; the docstrings here say how the
definition is implemented. Every rate is kept as a :class:`Ratio` so that a
report always shows what it was computed over, and a rate over nothing is
"undefined", never 0.

Harnesses name their tools differently, so each tool call is first given a
:class:`Kind` through :data:`TOOL_KINDS` (one row per harness tool), falling
back to a heuristic on the tool's name (:func:`kind_of`).
"""

from __future__ import annotations

import enum
import json
import posixpath
import re
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from openforge_trainer.analysis import episodes as ep

# -- tool kinds -------------------------------------------------------------------------


class Kind(enum.Enum):
    READ = "read"  # reads a file (or searches inside one)
    WRITE = "write"  # creates or overwrites a file
    EDIT = "edit"  # changes part of a file (edit, replace, patch)
    SHELL = "shell"  # runs a shell command
    PLAN = "plan"  # records or updates a step plan / todo list
    OTHER = "other"


# The documented mapping (docs/analysis.md repeats it; a test keeps the two equal).
TOOL_KINDS: dict[str, Kind] = {
    # ReAct (examples/harnesses/react)
    "read_file": Kind.READ,
    "write_file": Kind.WRITE,
    "shell": Kind.SHELL,
    # Codex CLI
    "apply_patch": Kind.EDIT,
    "update_plan": Kind.PLAN,
    "exec_command": Kind.SHELL,
    "local_shell": Kind.SHELL,
    "grep_files": Kind.READ,
    # Claude Code
    "Read": Kind.READ,
    "Write": Kind.WRITE,
    "Edit": Kind.EDIT,
    "MultiEdit": Kind.EDIT,
    "NotebookEdit": Kind.EDIT,
    "Bash": Kind.SHELL,
    "Grep": Kind.READ,
    "TodoWrite": Kind.PLAN,
    # OpenClaw
    "read": Kind.READ,
    "write": Kind.WRITE,
    "edit": Kind.EDIT,
    "exec": Kind.SHELL,
    "bash": Kind.SHELL,
    # Gemini CLI
    "read_many_files": Kind.READ,
    "replace": Kind.EDIT,
    "run_shell_command": Kind.SHELL,
    "search_file_content": Kind.READ,
    "write_todos": Kind.PLAN,
    # ZeroClaw
    "file_read": Kind.READ,
    "file_write": Kind.WRITE,
}

# Anthropic's text-editor tool: one tool whose ``command`` argument says what it does.
_EDITOR_TOOLS = frozenset({"str_replace_editor", "str_replace_based_edit_tool"})
_EDITOR_COMMANDS = {"view": Kind.READ, "create": Kind.WRITE}

# Name-heuristic tokens, tried in this order (first match wins).
_HEURISTIC: tuple[tuple[Kind, frozenset[str]], ...] = (
    (Kind.PLAN, frozenset({"todo", "todos", "plan"})),
    (Kind.EDIT, frozenset({"edit", "patch", "replace", "modify", "insert"})),
    (Kind.WRITE, frozenset({"write"})),
    (Kind.READ, frozenset({"read", "view", "cat", "grep"})),
    (Kind.SHELL,
     frozenset({"shell", "bash", "sh", "exec", "execute", "command", "terminal", "run"})),
)  # fmt: skip

_LOWER_KINDS = {name.lower(): kind for name, kind in TOOL_KINDS.items()}


def name_tokens(name: str) -> list[str]:
    """``runShellCommand`` / ``run-shell_command`` -> ``["run", "shell", "command"]``."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [token for token in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if token]


def kind_of(action: ep.Action) -> Kind:
    """The action's kind: the table, then its lower-cased name, then the name heuristic."""
    if action.name in _EDITOR_TOOLS:
        command = _arg(action, "command")
        return _EDITOR_COMMANDS.get(command if isinstance(command, str) else "", Kind.EDIT)
    kind = TOOL_KINDS.get(action.name) or _LOWER_KINDS.get(action.name.lower())
    if kind is not None:
        return kind
    tokens = set(name_tokens(action.name))
    if "create" in tokens and "file" in tokens:
        return Kind.WRITE
    for candidate, words in _HEURISTIC:
        if tokens & words:
            return candidate
    return Kind.OTHER


# -- what an action touches ----------------------------------------------------------------

PATH_KEYS = (
    "file_path", "path", "absolute_path", "filePath", "notebook_path", "filename", "file",
    "target_file", "paths",
)  # fmt: skip
COMMAND_KEYS = ("command", "cmd", "script")
_PATCH_PATH = re.compile(
    r"^\*\*\* (?:Add|Update|Delete) File: (.+?)\s*$|^\*\*\* Move to: (.+?)\s*$"
    r"|^\+\+\+ (?:b/)?(.+?)\s*$",
    re.MULTILINE,
)


def _arg(action: ep.Action, key: str) -> Any:
    return action.arguments.get(key) if isinstance(action.arguments, dict) else None


def _patch_text(action: ep.Action) -> str:
    for key in ("input", "patch", "diff"):
        value = _arg(action, key)
        if isinstance(value, str):
            return value
    return action.arguments if isinstance(action.arguments, str) else ""


def patch_paths(text: str) -> list[str]:
    """Files named by an apply_patch envelope (``*** Update File: x``) or a unified diff."""
    found = []
    for match in _PATCH_PATH.finditer(text):
        path = next(group for group in match.groups() if group is not None)
        if path != "/dev/null":
            found.append(path)
    return found


def normalize_path(path: str) -> str:
    text = path.strip().strip("'\"")
    return posixpath.normpath(text) if text else ""


def paths(action: ep.Action) -> tuple[str, ...]:
    """The file paths an action names: its path argument(s), or a patch's files."""
    found: list[str] = []
    for key in PATH_KEYS:
        value = _arg(action, key)
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list):
            found += [item for item in value if isinstance(item, str)]
    if not found and kind_of(action) is Kind.EDIT:
        found = patch_paths(_patch_text(action))
    return tuple(normalized for p in found if (normalized := normalize_path(p)))


def command(action: ep.Action) -> str | None:
    """A shell action's command line (an argv list joined with spaces)."""
    for key in COMMAND_KEYS:
        value = _arg(action, key)
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(isinstance(item, str) for item in value):
            return " ".join(value)
    return action.arguments if isinstance(action.arguments, str) else None


def same_path(a: str, b: str) -> bool:
    """Equal, or one ends with the other at a ``/`` (``/w/src/x.py`` and ``src/x.py``)."""
    return a == b or a.endswith("/" + b) or b.endswith("/" + a)


# -- shell commands that write ----------------------------------------------------------------

_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?[^\n]*\n.*?^\s*\1\s*$", re.DOTALL | re.MULTILINE)
_QUOTED = re.compile(r"'[^']*'|\"(?:[^\"\\]|\\.)*\"")
_REDIRECT = re.compile(r"(?<![\d&<>=-])>>?\s*(?![&>])([^\s;&|<>()]+)")
_SEGMENT = re.compile(r"&&|\|\||[;|\n]")
_IN_PLACE = ("sed", "perl")
_IN_PLACE_FLAG = re.compile(r"^(?:--in-place|-[A-Za-z]{0,2}i)")  # -i, -i.bak, perl's -pi
_COPIES = ("cp", "mv", "install")
_PATCHERS = ("patch",)


@dataclass(frozen=True, slots=True)
class ShellWrite:
    """A command that changes files: the paths it writes, when they can be told."""

    paths: tuple[str, ...]


def _tokens(segment: str) -> list[str]:
    try:
        tokens = shlex.split(segment, posix=True)
    except ValueError:
        tokens = segment.split()
    while tokens and (tokens[0] in ("sudo", "env", "command") or re.match(r"^\w+=", tokens[0])):
        tokens = tokens[1:]
    return tokens


def shell_write(text: str) -> ShellWrite | None:
    """The writes of a shell command (None when it writes nothing we can tell).

    Recognised: output redirection ``>``/``>>`` to a file (not ``/dev/null``,
    not an fd), ``tee``, in-place ``sed -i`` / ``perl -i`` (the last operand),
    ``cp``/``mv``/``install`` (the destination), ``touch``, ``patch`` and
    ``git apply`` (files unknown), and an apply_patch envelope
    (``*** Begin Patch``) given to a shell (Codex does this). Quoted strings
    and here-document bodies are ignored (a quoted file name becomes unknown).
    """
    if "*** Begin Patch" in text:
        return ShellWrite(tuple(normalize_path(p) for p in patch_paths(text)))
    bare = _QUOTED.sub("''", _HEREDOC.sub("", text))
    written = [m.group(1) for m in _REDIRECT.finditer(bare)]
    for segment in _SEGMENT.split(bare):
        found = _segment_writes(_tokens(segment))
        if found is not None:
            written += found or [""]
    written = [normalize_path(w) for w in written if normalize_path(w) != "/dev/null"]
    if not written:
        return None
    return ShellWrite(tuple(w for w in written if w))


def _segment_writes(tokens: Sequence[str]) -> list[str] | None:
    """The files one simple command writes ([] when unknown), None when it writes none."""
    if not tokens:
        return None
    program, operands = posixpath.basename(tokens[0]), tokens[1:]
    files = [token for token in operands if not token.startswith("-")]
    if program == "tee" or program == "touch":
        return files or None
    if program in _IN_PLACE and any(_IN_PLACE_FLAG.match(t) for t in operands):
        return files[-1:]
    if program in _COPIES and len(files) >= 2:
        return files[-1:]
    if program in _PATCHERS or list(tokens[:2]) == ["git", "apply"]:
        return []
    return None


_RUNS = re.compile(
    r"(?<![\w.-])(?:pytest|py\.test|unittest|tox|nox|jest|vitest|mocha|rspec|phpunit|ctest"
    r"|make|mvn|gradle|go\s+(?:test|run|build|vet)|cargo\s+(?:test|run|check|build)"
    r"|(?:npm|yarn|pnpm)\s+(?:run\s+)?test|dotnet\s+test)(?![\w-])"
)


def runs_checks(text: str) -> bool:
    """Whether a command runs a test suite or build (pytest, make, cargo test, ...)."""
    return _RUNS.search(text) is not None


def mentions(text: str, path: str) -> bool:
    """Whether ``text`` names ``path`` or, when at least 3 characters, its basename."""
    names = {path}
    base = posixpath.basename(path)
    if len(base) >= 3:
        names.add(base)
    return any(
        re.search(r"(?<![\w.-])" + re.escape(name) + r"(?![\w-]|\.\w)", text) for name in names
    )


# -- self-verification ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Mutation:
    """An action that writes or changes files, and whether a later action checks it."""

    index: int  # position of the action in the episode
    paths: tuple[str, ...]  # empty when the files cannot be told
    verified: bool


def mutation_paths(action: ep.Action) -> tuple[str, ...] | None:
    """The files an action writes or changes (possibly unknown: ``()``); None if it writes none."""
    kind = kind_of(action)
    if kind in (Kind.WRITE, Kind.EDIT):
        return paths(action)
    if kind is Kind.SHELL:
        text = command(action)
        found = shell_write(text) if text else None
        return found.paths if found is not None else None
    return None


def verifies(action: ep.Action, targets: Sequence[str]) -> bool:
    """Whether ``action`` reads back or runs what was written to ``targets``.

    A read of one of the paths; or a shell command that runs checks
    (:func:`runs_checks`) or, when it writes nothing itself, names one of the
    paths (:func:`mentions`: ``cat x``, ``python x.py``, ``./x.sh``).
    """
    kind = kind_of(action)
    if kind is Kind.READ:
        return any(same_path(p, t) for p in paths(action) for t in targets)
    if kind is not Kind.SHELL:
        return False
    text = command(action)
    if not text:
        return False
    if runs_checks(text):
        return True
    return mutation_paths(action) is None and any(mentions(text, t) for t in targets)


def mutations(actions: Sequence[ep.Action]) -> list[Mutation]:
    found = []
    for index, action in enumerate(actions):
        targets = mutation_paths(action)
        if targets is None:
            continue
        verified = any(verifies(later, targets) for later in actions[index + 1 :])
        found.append(Mutation(index, targets, verified))
    return found


# -- failed tool calls -----------------------------------------------------------------------

_ERROR_PREFIX = re.compile(r"^\s*(?:error\s*:|<tool_use_error>|error executing tool\b)", re.I)
_EXIT_LINE = re.compile(
    r"^[\s\[(]*(?:process\s+)?(?:exit(?:ed)?(?:\s+with)?[\s_]*(?:code|status)|return\s*code"
    r"|returncode)\s*[:=]?\s*(-?\d+)",
    re.I | re.MULTILINE,
)


def _structured_failure(text: str) -> bool | None:
    """For a JSON-object result: its exit code or error says; None when it has neither."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    metadata = value.get("metadata")
    for holder in (value, metadata if isinstance(metadata, dict) else {}):
        code = holder.get("exit_code")
        if isinstance(code, int) and not isinstance(code, bool):
            return code != 0
    if value.get("error") not in (None, "", False, {}, []):
        return True
    return None


def failed(result: ep.ToolResult) -> bool:
    """Whether a tool result signals failure (docs/analysis.md, "Failed tool call").

    In order: the API's error flag when set; for a JSON-object result, a
    non-zero ``exit_code`` (top level or under ``metadata``) or a non-empty
    ``error``; text that starts with ``error:`` / ``<tool_use_error>`` /
    ``Error executing tool``; a line that reports a non-zero exit code
    (``[exit code 1]``, ``Exit code: 2``, ``Process exited with code 1``).
    """
    if result.flagged_error:
        return True
    structured = _structured_failure(result.text)
    if structured is not None:
        return structured
    if _ERROR_PREFIX.match(result.text):
        return True
    return any(int(match.group(1)) != 0 for match in _EXIT_LINE.finditer(result.text))


# -- plans -------------------------------------------------------------------------------------

PLAN_ITEM_KEYS = ("plan", "todos", "items", "steps", "tasks")
DONE_STATUSES = frozenset({"completed", "complete", "done", "finished"})
_NUMBERED = re.compile(r"^\s{0,3}\d{1,2}[.)]\s+\S", re.MULTILINE)
_BULLETED = re.compile(r"^\s{0,3}[-*•]\s+\S", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Plan:
    """A multi-step plan an episode stated, and how much of it got done."""

    source: str  # "tool" (a plan/todo tool's final state) or "text" (a list in the reply)
    steps: int
    completed: int  # steps counted as done (for text plans, a proxy: see plan_of)
    fully_completed: bool

    @property
    def completion(self) -> float:
        return self.completed / self.steps


def plan_items(action: ep.Action) -> list[dict[str, Any]] | None:
    """The items of a plan/todo tool call (objects with a ``status``), None if it has none."""
    for key in PLAN_ITEM_KEYS:
        value = _arg(action, key)
        if isinstance(value, list):
            items = [item for item in value if isinstance(item, dict)]
            if items and all(isinstance(item.get("status"), str) for item in items):
                return items
    return None


def list_items(text: str) -> int:
    """How many numbered items (else bulleted items) a text holds."""
    numbered = len(_NUMBERED.findall(text))
    return numbered if numbered >= 2 else len(_BULLETED.findall(text))


def _tool_plan(episode: ep.Episode) -> Plan | None:
    states = [
        items
        for action in episode.actions
        if kind_of(action) is Kind.PLAN and (items := plan_items(action)) is not None
    ]
    if not any(len(items) >= 2 for items in states):
        return None
    final = states[-1]
    done = sum(str(item["status"]).lower() in DONE_STATUSES for item in final)
    return Plan("tool", len(final), done, done == len(final))


def _text_plan(episode: ep.Episode, success: bool) -> Plan | None:
    for turn in episode.turns:
        steps = list_items(turn.text)
        if steps < 2 or (turn.final and turn.actions == 0):
            continue
        later = {
            (action.name, json.dumps(action.arguments, sort_keys=True, default=str))
            for action in episode.actions
            if action.call_index >= turn.call_index
        }
        return Plan("text", steps, min(len(later), steps), len(later) >= steps and success)
    return None


def plan_of(episode: ep.Episode, *, success: bool) -> Plan | None:
    """The episode's multi-step plan, if it stated one.

    A plan tool (:attr:`Kind.PLAN`) called with at least two items makes a
    tool plan, judged by the tool's *last* call: steps are its items,
    completed the items whose status is completed/done. Otherwise the first
    reply text with at least two numbered (else bulleted) list items makes a
    text plan, unless that reply is the episode's last one and calls no tool
    (a closing summary, not a plan): its steps are the items; completed is the
    number of distinct tool calls (name and arguments) from that reply on,
    capped at the steps; fully completed needs as many distinct calls as steps
    and a successful episode.
    """
    return _tool_plan(episode) or _text_plan(episode, success)


# -- one episode ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EpisodeMetrics:
    episode: ep.Episode
    success: bool | None  # None: the rollout has no reward
    mutations: tuple[Mutation, ...]
    tools_used: frozenset[str]  # offered tools it called
    unknown_tool_calls: int  # calls to tools no request offered
    tool_results: int  # actions whose result came back
    failed_tool_calls: int
    plan: Plan | None

    @property
    def coverage(self) -> float | None:
        offered = self.episode.tools_offered
        return len(self.tools_used) / len(offered) if offered else None


def measure(episode: ep.Episode, *, success_threshold: float = 0.0) -> EpisodeMetrics:
    """Every per-episode quantity the group metrics are built from.

    Success: the rollout has a reward and it is strictly above ``success_threshold``.
    """
    success = None if episode.reward is None else episode.reward > success_threshold
    called = [action.name for action in episode.actions]
    results = [action.result for action in episode.actions if action.result is not None]
    return EpisodeMetrics(
        episode=episode,
        success=success,
        mutations=tuple(mutations(episode.actions)),
        tools_used=frozenset(called) & episode.tools_offered,
        unknown_tool_calls=sum(name not in episode.tools_offered for name in called),
        tool_results=len(results),
        failed_tool_calls=sum(failed(result) for result in results),
        plan=plan_of(episode, success=bool(success)),
    )


# -- groups -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ratio:
    """``numerator / denominator``; undefined (None) over nothing. Means are ratios too."""

    numerator: float = 0.0
    denominator: int = 0

    @property
    def value(self) -> float | None:
        return self.numerator / self.denominator if self.denominator else None

    @classmethod
    def of(cls, values: Iterable[float | bool | None]) -> Ratio:
        """The mean of the values that are not None (a bool counts 1 or 0)."""
        present = [float(v) for v in values if v is not None]
        return cls(sum(present), len(present))


@dataclass(frozen=True, slots=True)
class Summary:
    """The metrics of a group of episodes (docs/analysis.md defines each)."""

    episodes: int
    rewarded: int
    decode_problems: int  # episodes with calls that did not decode
    mean_reward: Ratio
    success: Ratio
    turns: Ratio  # model calls per episode
    tool_calls: Ratio  # tool calls per episode
    self_verification: Ratio  # verified mutations / mutations
    verified_episodes: Ratio  # episodes whose last mutation is verified / episodes with one
    tool_coverage: Ratio  # mean over episodes offering tools
    tools_offered: tuple[str, ...]
    tools_used: tuple[str, ...]
    unknown_tool_calls: int
    failed_tool_calls: Ratio  # failed results / results
    error_episodes: int
    error_recovery: Ratio  # successful / rewarded episodes with a failed tool call
    plan_episodes: int
    plan_completion: Ratio  # mean completed steps / steps over plan episodes
    plans_fully_completed: Ratio
    plan_sources: dict[str, int] = field(default_factory=dict)


def summarize(measured: Sequence[EpisodeMetrics]) -> Summary:
    every_mutation = [m for e in measured for m in e.mutations]
    with_mutations = [e for e in measured if e.mutations]
    errors = [e for e in measured if e.failed_tool_calls]
    plans = [e.plan for e in measured if e.plan is not None]
    sources: dict[str, int] = {}
    for plan in plans:
        sources[plan.source] = sources.get(plan.source, 0) + 1
    return Summary(
        episodes=len(measured),
        rewarded=sum(e.episode.reward is not None for e in measured),
        decode_problems=sum(bool(e.episode.problems) for e in measured),
        mean_reward=Ratio.of(e.episode.reward for e in measured),
        success=Ratio.of(e.success for e in measured),
        turns=Ratio.of(len(e.episode.turns) for e in measured),
        tool_calls=Ratio.of(len(e.episode.actions) for e in measured),
        self_verification=Ratio.of(m.verified for m in every_mutation),
        verified_episodes=Ratio.of(e.mutations[-1].verified for e in with_mutations),
        tool_coverage=Ratio.of(e.coverage for e in measured),
        tools_offered=tuple(sorted(set().union(*(e.episode.tools_offered for e in measured)))),
        tools_used=tuple(sorted(set().union(*(e.tools_used for e in measured)))),
        unknown_tool_calls=sum(e.unknown_tool_calls for e in measured),
        failed_tool_calls=Ratio(
            sum(e.failed_tool_calls for e in measured), sum(e.tool_results for e in measured)
        ),
        error_episodes=len(errors),
        error_recovery=Ratio.of(e.success for e in errors),
        plan_episodes=len(plans),
        plan_completion=Ratio.of(plan.completion for plan in plans),
        plans_fully_completed=Ratio.of(plan.fully_completed for plan in plans),
        plan_sources=sources,
    )


GROUPINGS = ("harness", "policy-version", "both")


@dataclass(frozen=True, slots=True, order=True)
class GroupKey:
    harness: str | None = None  # None: all harnesses
    policy_version: int | None = None  # None: all policy versions

    def label(self) -> str:
        parts = []
        if self.harness is not None:
            parts.append(self.harness or "(unnamed)")
        if self.policy_version is not None:
            parts.append(f"v{self.policy_version}")
        return " ".join(parts) or "all"


def key_of(episode: ep.Episode, by: str) -> GroupKey:
    if by not in GROUPINGS:
        raise ValueError(f"by must be one of {', '.join(GROUPINGS)}, not {by!r}")
    harness = episode.harness if by in ("harness", "both") else None
    version = episode.policy_version if by in ("policy-version", "both") else None
    return GroupKey(harness, version)


def grouped(measured: Iterable[EpisodeMetrics], by: str) -> dict[GroupKey, Summary]:
    """One summary per group, in key order."""
    groups: dict[GroupKey, list[EpisodeMetrics]] = {}
    for item in measured:
        groups.setdefault(key_of(item.episode, by), []).append(item)
    return {key: summarize(groups[key]) for key in sorted(groups, key=_sort_key)}


def _sort_key(key: GroupKey) -> tuple[str, int]:
    return (key.harness or "", -1 if key.policy_version is None else key.policy_version)


# -- the metrics a report shows ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Metric:
    name: str  # the JSON key
    label: str  # the table header
    ratio: Callable[[Summary], Ratio]
    percent: bool  # shown as a percentage
    mean: bool = False  # a mean of per-episode fractions, not a count over a count


METRICS: tuple[Metric, ...] = (
    Metric("mean_reward", "reward", lambda s: s.mean_reward, False),
    Metric("success_rate", "success", lambda s: s.success, True),
    Metric("turns", "turns", lambda s: s.turns, False),
    Metric("tool_calls", "tool calls", lambda s: s.tool_calls, False),
    Metric("self_verification", "self-verif.", lambda s: s.self_verification, True),
    Metric("verified_episodes", "verif. episodes", lambda s: s.verified_episodes, True),
    Metric("tool_coverage", "tool coverage", lambda s: s.tool_coverage, True, True),
    Metric("failed_tool_calls", "failed calls", lambda s: s.failed_tool_calls, True),
    Metric("error_recovery", "error recovery", lambda s: s.error_recovery, True),
    Metric("plan_completion", "plan completion", lambda s: s.plan_completion, True, True),
    Metric("plans_fully_completed", "plans done", lambda s: s.plans_fully_completed, True),
)


def delta(before: Ratio, after: Ratio) -> float | None:
    """``after - before``; None when either is undefined."""
    if before.value is None or after.value is None:
        return None
    return after.value - before.value
