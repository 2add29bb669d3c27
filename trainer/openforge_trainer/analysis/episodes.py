"""A rollout's stored model calls decoded into an episode: the agent's tool actions.

The sidecar stores each call's request and response bodies exactly as the
harness exchanged them, in the harness's wire API (OpenAI Chat Completions,
OpenAI Responses, Anthropic Messages, Gemini ``generateContent``). This
module reads those bodies with the codec the sidecar parsed them with
(:mod:`openforge.wire.codecs`) and turns the canonical conversation into one
API-independent, typed :class:`Episode` for the behaviour metrics
(:mod:`openforge_trainer.analysis.metrics`). It is pure: the caller reads the store.

What is taken from where:

* **Actions** (tool calls) and the assistant's **text** come from the
  *responses*, in call order: what the policy produced. A call that failed or
  was lost contributes no actions.
* **Tool results** come from the *requests*, where the harness sends them
  back. A result is attached to the action with the same call id. Where the
  API gives none (Gemini often sends none), the codec has already given the
  result the id of the earliest unanswered call of the same name in that
  request's history; that history call is taken to be the episode's action
  at the same position (when the names agree). Histories repeat from request
  to request, so a result is attached once, the first time it is seen.
* **Tools offered**: every function tool defined in any request of the episode.

Bodies the codec refuses are not guessed at: the call's problem is kept in
:attr:`Episode.problems` (naming the call and the JSON path at fault) and the
rest of the episode is still decoded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from openforge.wire import codecs, conversation
from openforge.wire.codecs.errors import CodecError

from openforge_trainer.collection import store as store_module
from openforge_trainer.trajectories import outcome


class DecodeError(Exception):
    """A stored body does not have its wire API's shape (names the JSON path)."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(f"{path}: {message}" if path else message)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool call returned, as the harness reported it to the model.

    ``flagged_error`` is the API's own error flag (Anthropic ``is_error``, a
    Gemini ``error`` key): True or False where the API has one, None where
    it has none (OpenAI Chat and Responses), when only the text can tell.
    """

    text: str
    flagged_error: bool | None = None


@dataclass(frozen=True, slots=True)
class Action:
    """One tool call the policy made."""

    call_index: int  # the model call whose response holds it
    position: int  # 0-based among that response's tool calls
    id: str  # "" when the API gave none
    name: str
    arguments: Any  # the parsed JSON arguments (usually a dict), or the raw text
    result: ToolResult | None = None  # None: the harness never sent one back


@dataclass(frozen=True, slots=True)
class Turn:
    """One model call, decoded."""

    call_index: int
    wire_api: str  # the proto enum name, e.g. WIRE_API_OPENAI_CHAT
    policy_version: int  # as the engine reported it for this call
    text: str  # the assistant's visible text in the response (no reasoning)
    actions: int  # how many tool calls the response holds
    failed: bool  # the call failed (error set or HTTP >= 400): no response to read
    final: bool = False  # the episode's last model call


@dataclass(frozen=True, slots=True)
class Episode:
    """One rollout as an agent episode."""

    rollout_id: str
    job: str
    task_id: str
    harness: str  # the HarnessEnv's name, from the rollout-started record
    policy_version: int  # the rollout's sampling policy version (started record)
    status: (
        str  # succeeded | failed | timeout ("" when never finished; stopped ones are not episodes)
    )
    reward: float | None  # None when the rollout has no reward
    turns: tuple[Turn, ...]
    actions: tuple[Action, ...]
    tools_offered: frozenset[str]
    problems: tuple[str, ...] = ()

    @property
    def wire_apis(self) -> frozenset[str]:
        return frozenset(turn.wire_api for turn in self.turns)


# -- the decoded halves of one call ---------------------------------------------


@dataclass(frozen=True, slots=True)
class _Call:
    id: str
    name: str
    arguments: Any


@dataclass(frozen=True, slots=True)
class _Result:
    id: str
    name: str  # "" when unknown
    result: ToolResult


@dataclass
class _Request:
    tools: list[str] = field(default_factory=list)
    history: list[_Call | _Result] = field(default_factory=list)


@dataclass
class _Response:
    text: list[str] = field(default_factory=list)
    calls: list[_Call] = field(default_factory=list)


# -- the codecs' reading, as actions and results ---------------------------------------

#: APIs whose tool results carry an error flag of their own (Anthropic
#: ``is_error``, a Gemini ``response`` holding ``error``).
_FLAGGING_APIS = frozenset({conversation.WireApi.ANTHROPIC_MESSAGES, conversation.WireApi.GEMINI})


def _codec(call: store_module.ModelCall) -> tuple[conversation.WireApi, codecs.Codec]:
    try:
        api = conversation.WireApi.from_proto_name(call.wire_api)
    except ValueError:
        raise DecodeError(f"wire API {call.wire_api} is not one this analysis reads") from None
    return api, codecs.for_api(api)


def _call(part: conversation.ToolCallPart) -> _Call:
    return _Call(part.id, part.name, part.parsed_arguments())


def _result(api: conversation.WireApi, part: conversation.ToolResultPart) -> _Result:
    flagged = part.is_error if api in _FLAGGING_APIS else None
    return _Result(part.tool_call_id, part.name or "", ToolResult(part.text, flagged))


# -- one episode -------------------------------------------------------------------------


def call_failed(call: store_module.ModelCall) -> bool:
    """A call that did not complete (the rule training uses, :mod:`outcome`) or has no answer."""
    return not outcome.completed(call) or not call.response_json


def decode_request(call: store_module.ModelCall) -> _Request:
    """The tools offered and the tool calls and results of a call's request."""
    api, codec = _codec(call)
    try:
        parsed = codec.parse_request(call.request_json)
    except CodecError as exc:
        raise DecodeError(str(exc), "request_json") from None
    request = _Request(tools=[tool.name for tool in parsed.tools])
    for message in parsed.messages:
        for part in message.parts:
            if isinstance(part, conversation.ToolCallPart):
                request.history.append(_call(part))
            elif isinstance(part, conversation.ToolResultPart):
                request.history.append(_result(api, part))
    return request


def decode_response(call: store_module.ModelCall) -> _Response:
    """The assistant's text and tool calls in a call's response."""
    _, codec = _codec(call)
    try:
        message = codec.parse_response(call.response_json).message
    except CodecError as exc:
        raise DecodeError(str(exc), "response_json") from None
    return _Response(text=[message.text], calls=[_call(part) for part in message.tool_calls])


@dataclass
class _Builder:
    actions: list[Action] = field(default_factory=list)
    results: dict[int, ToolResult] = field(default_factory=dict)  # action index -> result
    by_id: dict[str, list[int]] = field(default_factory=dict)

    def add_action(self, action: Action) -> None:
        if action.id:
            self.by_id.setdefault(action.id, []).append(len(self.actions))
        self.actions.append(action)

    def attach(self, request: _Request) -> None:
        """Attach the results of one request's history (see the module docstring)."""
        history_calls = [item for item in request.history if isinstance(item, _Call)]
        paired: set[int] = set()
        for item in request.history:
            if not isinstance(item, _Result):
                continue
            target = self._by_id(item.id)
            slot = self._history_slot(item, history_calls, paired=paired)
            if slot is not None:
                paired.add(slot)
                same = slot < len(self.actions) and (
                    self.actions[slot].name == history_calls[slot].name
                )
                if target is None and same:
                    target = slot
            if target is not None and target not in self.results:
                self.results[target] = item.result

    def _by_id(self, call_id: str) -> int | None:
        candidates = self.by_id.get(call_id, []) if call_id else []
        unanswered = [index for index in candidates if index not in self.results]
        if unanswered:
            return unanswered[0]
        return candidates[0] if candidates else None

    @staticmethod
    def _history_slot(item: _Result, calls: Sequence[_Call], *, paired: set[int]) -> int | None:
        for index, call in enumerate(calls):
            if index in paired:
                continue
            if item.id and call.id == item.id:
                return index
            if not item.id and (not item.name or call.name == item.name):
                return index
        return None

    def finish(self) -> tuple[Action, ...]:
        return tuple(
            Action(a.call_index, a.position, a.id, a.name, a.arguments, self.results.get(i))
            for i, a in enumerate(self.actions)
        )


def episode(rollout: store_module.Rollout, calls: Sequence[store_module.ModelCall]) -> Episode:
    """The episode of ``rollout`` from its stored ``calls`` (any order)."""
    ordered = sorted(calls, key=lambda call: call.call_index)
    builder = _Builder()
    turns: list[Turn] = []
    tools: set[str] = set()
    problems: list[str] = []
    for call in ordered:
        try:
            request = decode_request(call)
        except DecodeError as exc:
            problems.append(f"call {call.call_index} {exc}")
            request = _Request()
        tools.update(request.tools)
        builder.attach(request)
        response = _Response()
        failed = call_failed(call)
        if not failed:
            try:
                response = decode_response(call)
            except DecodeError as exc:
                problems.append(f"call {call.call_index} {exc}")
        for position, found in enumerate(response.calls):
            builder.add_action(
                Action(call.call_index, position, found.id, found.name, found.arguments)
            )
        turns.append(
            Turn(
                call_index=call.call_index,
                wire_api=call.wire_api,
                policy_version=call.policy_version,
                text="".join(response.text),
                actions=len(response.calls),
                failed=failed,
                final=call is ordered[-1],
            )
        )
    return Episode(
        rollout_id=rollout.rollout_id,
        job=rollout.job,
        task_id=rollout.task_id,
        harness=rollout.harness,
        policy_version=rollout.policy_version,
        status=rollout.status,
        reward=rollout.reward if rollout.has_reward else None,
        turns=tuple(turns),
        actions=builder.finish(),
        tools_offered=frozenset(tools),
        problems=tuple(problems),
    )
