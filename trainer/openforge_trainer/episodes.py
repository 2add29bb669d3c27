"""A rollout's stored model calls decoded into an episode: the agent's tool actions.

The sidecar stores each call's request and response bodies exactly as the
harness exchanged them, in the harness's wire API (OpenAI Chat Completions,
OpenAI Responses, Anthropic Messages, Gemini ``generateContent``). This
module reads those bodies into one API-independent, typed :class:`Episode`
for the behaviour metrics (:mod:`openforge_trainer.analysis`). It is pure:
the caller reads the store.

What is taken from where:

* **Actions** (tool calls) and the assistant's **text** come from the
  *responses*, in call order: what the policy produced. A call that failed or
  was lost contributes no actions.
* **Tool results** come from the *requests*, where the harness sends them
  back. A result is attached to the action with the same call id (``id``,
  ``call_id``, ``tool_use_id``); a result without a usable id (Gemini often
  sends none) is paired, within its request, with the earliest unanswered
  tool call of the same name in that request's history, and that history
  call is taken to be the episode's action at the same position (when the
  names agree). Histories repeat from request to request, so a result is
  attached once, the first time it is seen.
* **Tools offered**: every tool name defined in any request of the episode.

Bodies that do not decode are not guessed at: the call's problem is kept in
:attr:`Episode.problems` (naming the call and the JSON path at fault) and the
rest of the episode is still decoded.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from openforge_trainer import store as store_module


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
    status: str  # succeeded | failed | timeout ("" when never finished)
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


# -- typed JSON reads --------------------------------------------------------------


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "array"}.get(
        type(value), "object"
    )


def _object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DecodeError(f"expected an object, got {_kind(value)}", path)
    return value


def _list(value: Any, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise DecodeError(f"expected an array, got {_kind(value)}", path)
    return value


def _str(body: dict[str, Any], key: str, path: str, *, default: str | None = None) -> str:
    value = body.get(key, default)
    if not isinstance(value, str):
        raise DecodeError(f"expected a string, got {_kind(value)}", _join(path, key))
    return value


def _load(body: bytes, what: str) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise DecodeError(f"not valid JSON ({exc})", what) from None


def _arguments(text: str) -> Any:
    """Function-call arguments as JSON when they parse, else the raw text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def content_text(content: Any) -> str:
    """The text of a content value in any of the APIs' shapes.

    A string is itself; a list joins its parts' ``text`` (``text``,
    ``input_text``, ``output_text`` parts; images and other parts add
    nothing); an object with ``text`` is that text; anything else (a
    structured tool output) is its compact JSON.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(content_text(part) for part in content if _is_text_part(part))
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        return str(content["text"])
    return json.dumps(content, separators=(",", ":"), ensure_ascii=False)


def _is_text_part(part: Any) -> bool:
    if isinstance(part, str):
        return True
    return isinstance(part, dict) and isinstance(part.get("text"), str)


# -- OpenAI Chat Completions ---------------------------------------------------------


def _chat_request(body: dict[str, Any]) -> _Request:
    request = _Request()
    for i, raw in enumerate(_list(body.get("tools"), "tools")):
        tool = _object(raw, f"tools[{i}]")
        if tool.get("type", "function") == "function":
            function = _object(tool.get("function"), f"tools[{i}].function")
            request.tools.append(_str(function, "name", f"tools[{i}].function"))
    for i, raw in enumerate(_list(body.get("functions"), "functions")):
        request.tools.append(_str(_object(raw, f"functions[{i}]"), "name", f"functions[{i}]"))
    for i, raw in enumerate(_list(body.get("messages"), "messages")):
        at = f"messages[{i}]"
        message = _object(raw, at)
        role = _str(message, "role", at)
        if role == "assistant":
            request.history += _chat_calls(message, at)
        elif role == "tool":
            result = ToolResult(content_text(message.get("content")))
            request.history.append(_Result(_str(message, "tool_call_id", at), "", result))
        elif role == "function":
            result = ToolResult(content_text(message.get("content")))
            request.history.append(_Result("", _str(message, "name", at), result))
    return request


def _chat_calls(message: dict[str, Any], path: str) -> list[_Call]:
    calls = []
    for j, raw in enumerate(_list(message.get("tool_calls"), f"{path}.tool_calls")):
        at = f"{path}.tool_calls[{j}]"
        call = _object(raw, at)
        function = _object(call.get("function"), f"{at}.function")
        arguments = _str(function, "arguments", f"{at}.function", default="")
        calls.append(
            _Call(
                _str(call, "id", at, default=""),
                _str(function, "name", f"{at}.function"),
                _arguments(arguments),
            )
        )
    if isinstance(message.get("function_call"), dict):
        function = message["function_call"]
        at = f"{path}.function_call"
        arguments = _str(function, "arguments", at, default="")
        calls.append(_Call("", _str(function, "name", at), _arguments(arguments)))
    return calls


def _chat_response(body: dict[str, Any]) -> _Response:
    response = _Response()
    choices = _list(body.get("choices"), "choices")
    if choices:
        message = _object(_object(choices[0], "choices[0]").get("message"), "choices[0].message")
        response.text.append(content_text(message.get("content")))
        response.calls = _chat_calls(message, "choices[0].message")
    return response


# -- OpenAI Responses -----------------------------------------------------------------

_RESPONSES_FUNCTION_TOOLS = ("function", "custom")


def _responses_request(body: dict[str, Any]) -> _Request:
    request = _Request()
    for i, raw in enumerate(_list(body.get("tools"), "tools")):
        tool = _object(raw, f"tools[{i}]")
        kind = _str(tool, "type", f"tools[{i}]")
        # built-in tools (web_search, local_shell, ...) are named by their type
        name = _str(tool, "name", f"tools[{i}]") if kind in _RESPONSES_FUNCTION_TOOLS else kind
        request.tools.append(name)
    raw_input = body.get("input")
    if isinstance(raw_input, str):
        return request
    for i, raw in enumerate(_list(raw_input, "input")):
        at = f"input[{i}]"
        item = _object(raw, at)
        kind = _str(item, "type", at, default="message")
        if kind.endswith("_call_output"):
            text = content_text(item.get("output"))
            request.history.append(_Result(_str(item, "call_id", at), "", ToolResult(text)))
        elif kind.endswith("_call"):
            request.history.append(_responses_call(item, at))
    return request


def _responses_call(item: dict[str, Any], path: str) -> _Call:
    kind = _str(item, "type", path)
    if kind == "function_call":
        arguments = _arguments(_str(item, "arguments", path, default=""))
        return _Call(_str(item, "call_id", path), _str(item, "name", path), arguments)
    if kind == "custom_tool_call":
        arguments = {"input": _str(item, "input", path)}
        return _Call(_str(item, "call_id", path), _str(item, "name", path), arguments)
    # a built-in tool's call (local_shell_call, web_search_call, ...): named by
    # its type, its arguments are the item's ``action`` when it has one
    call_id = item.get("call_id") or item.get("id") or ""
    if not isinstance(call_id, str):
        raise DecodeError(f"expected a string, got {_kind(call_id)}", _join(path, "call_id"))
    return _Call(call_id, kind.removesuffix("_call"), item.get("action", {}))


def _responses_response(body: dict[str, Any]) -> _Response:
    response = _Response()
    for i, raw in enumerate(_list(body.get("output"), "output")):
        at = f"output[{i}]"
        item = _object(raw, at)
        kind = _str(item, "type", at)
        if kind == "message":
            response.text.append(content_text(item.get("content")))
        elif kind.endswith("_call"):
            response.calls.append(_responses_call(item, at))
    return response


# -- Anthropic Messages --------------------------------------------------------------


def _anthropic_request(body: dict[str, Any]) -> _Request:
    request = _Request()
    for i, raw in enumerate(_list(body.get("tools"), "tools")):
        request.tools.append(_str(_object(raw, f"tools[{i}]"), "name", f"tools[{i}]"))
    for i, raw in enumerate(_list(body.get("messages"), "messages")):
        at = f"messages[{i}]"
        message = _object(raw, at)
        content = message.get("content")
        if isinstance(content, str):
            continue
        for j, block_raw in enumerate(_list(content, f"{at}.content")):
            bat = f"{at}.content[{j}]"
            block = _object(block_raw, bat)
            kind = block.get("type")
            if kind in ("tool_use", "server_tool_use"):
                request.history.append(_anthropic_call(block, bat))
            elif kind == "tool_result":
                flag = block.get("is_error", False)
                result = ToolResult(content_text(block.get("content")), bool(flag))
                request.history.append(_Result(_str(block, "tool_use_id", bat), "", result))
    return request


def _anthropic_call(block: dict[str, Any], path: str) -> _Call:
    return _Call(_str(block, "id", path), _str(block, "name", path), block.get("input", {}))


def _anthropic_response(body: dict[str, Any]) -> _Response:
    response = _Response()
    for i, raw in enumerate(_list(body.get("content"), "content")):
        at = f"content[{i}]"
        block = _object(raw, at)
        kind = block.get("type")
        if kind == "text":
            response.text.append(_str(block, "text", at))
        elif kind in ("tool_use", "server_tool_use"):
            response.calls.append(_anthropic_call(block, at))
    return response


# -- Gemini generateContent -----------------------------------------------------------


def _camel_or_snake(body: dict[str, Any], camel: str) -> str | None:
    """The key ``body`` spells ``camel`` with (the API accepts snake_case too), if any."""
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)
    return camel if camel in body else snake if snake in body else None


def _gemini_request(body: dict[str, Any]) -> _Request:
    request = _Request()
    for i, raw in enumerate(_list(body.get("tools"), "tools")):
        tool = _object(raw, f"tools[{i}]")
        key = _camel_or_snake(tool, "functionDeclarations")
        if key is None:
            continue  # googleSearch, codeExecution, ...: not function tools
        for j, declaration in enumerate(_list(tool[key], f"tools[{i}].{key}")):
            at = f"tools[{i}].{key}[{j}]"
            request.tools.append(_str(_object(declaration, at), "name", at))
    for i, raw in enumerate(_list(body.get("contents"), "contents")):
        at = f"contents[{i}]"
        for j, part_raw in enumerate(_list(_object(raw, at).get("parts"), f"{at}.parts")):
            pat = f"{at}.parts[{j}]"
            part = _object(part_raw, pat)
            if key := _camel_or_snake(part, "functionCall"):
                request.history.append(_gemini_call(part[key], f"{pat}.{key}"))
            elif key := _camel_or_snake(part, "functionResponse"):
                request.history.append(_gemini_result(part[key], f"{pat}.{key}"))
    return request


def _gemini_call(raw: Any, path: str) -> _Call:
    call = _object(raw, path)
    return _Call(_str(call, "id", path, default=""), _str(call, "name", path), call.get("args", {}))


def _gemini_result(raw: Any, path: str) -> _Result:
    """A ``functionResponse``: its ``response`` object holds ``output`` or ``error``."""
    answer = _object(raw, path)
    response = answer.get("response")
    flagged = isinstance(response, dict) and response.get("error") not in (None, "", {})
    if isinstance(response, dict) and isinstance(response.get("output"), str) and not flagged:
        text = str(response["output"])
    elif isinstance(response, dict) and isinstance(response.get("error"), str):
        text = str(response["error"])
    else:
        text = content_text(response)
    return _Result(
        _str(answer, "id", path, default=""),
        _str(answer, "name", path),
        ToolResult(text, flagged),
    )


def _gemini_response(body: Any) -> _Response:
    """A response object, or (streamed, unassembled) an array of chunk objects."""
    response = _Response()
    chunks = body if isinstance(body, list) else [body]
    for c, chunk_raw in enumerate(chunks):
        cat = f"[{c}]" if isinstance(body, list) else ""
        chunk = _object(chunk_raw, cat)
        candidates = _list(chunk.get("candidates"), _join(cat, "candidates"))
        if not candidates:
            continue
        at = _join(_join(cat, "candidates"), 0)
        content = _object(_object(candidates[0], at).get("content") or {}, f"{at}.content")
        for j, part_raw in enumerate(_list(content.get("parts"), f"{at}.content.parts")):
            pat = f"{at}.content.parts[{j}]"
            part = _object(part_raw, pat)
            if key := _camel_or_snake(part, "functionCall"):
                response.calls.append(_gemini_call(part[key], f"{pat}.{key}"))
            elif isinstance(part.get("text"), str) and not part.get("thought"):
                response.text.append(part["text"])
    return response


_DECODERS: dict[str, tuple[Callable[[dict[str, Any]], _Request], Callable[[Any], _Response]]] = {
    "WIRE_API_OPENAI_CHAT": (_chat_request, _chat_response),
    "WIRE_API_OPENAI_RESPONSES": (_responses_request, _responses_response),
    "WIRE_API_ANTHROPIC_MESSAGES": (_anthropic_request, _anthropic_response),
    "WIRE_API_GEMINI": (_gemini_request, _gemini_response),
}


# -- one episode -------------------------------------------------------------------------


def call_failed(call: store_module.ModelCall) -> bool:
    return bool(call.error) or call.http_status >= 400 or not call.response_json


def decode_request(call: store_module.ModelCall) -> _Request:
    decoder = _DECODERS.get(call.wire_api)
    if decoder is None:
        raise DecodeError(f"wire API {call.wire_api} is not one this analysis reads")
    body = _load(call.request_json, "request_json")
    return decoder[0](_object(body, "request_json"))


def decode_response(call: store_module.ModelCall) -> _Response:
    decoder = _DECODERS.get(call.wire_api)
    if decoder is None:
        raise DecodeError(f"wire API {call.wire_api} is not one this analysis reads")
    body = _load(call.response_json, "response_json")
    if call.wire_api != "WIRE_API_GEMINI":
        body = _object(body, "response_json")
    return decoder[1](body)


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
            slot = self._history_slot(item, history_calls, paired)
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
    def _history_slot(item: _Result, calls: Sequence[_Call], paired: set[int]) -> int | None:
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
