"""Google's Gemini API (``models/{model}:generateContent``), JSON and SSE.

Unlike the other wire APIs, Gemini names the model and the method in the
URL (``/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse``), so a
codec is bound to the path it serves: :func:`for_path` builds one per call.
Streams are server-sent events only (``alt=sse``, what Google's SDKs and
Gemini CLI use); the JSON-array stream a bare ``streamGenerateContent``
returns is refused with an error naming ``alt``.

Requests may spell fields in lowerCamelCase or snake_case, as the proto3
JSON mapping the API follows accepts both; errors name the field as sent.

* ``model`` turns map to assistant messages: text, thoughts (``thought:
  true``, with their ``thoughtSignature``) and ``functionCall`` parts.
  ``user`` turns map to user messages (text, ``inlineData`` and
  ``fileData`` images kept as sent) and, for each ``functionResponse``, a
  ``tool`` message placed before the rest of the turn. A function call
  without an ``id`` gets one from its position; a response without one is
  matched to the earliest unanswered call of that name.
* A function response's ``output`` and ``error`` keys (Google's documented
  convention) become the result text; any other object is the output, as
  JSON. Images in ``functionResponse.parts`` stay with the result.
* Thoughts reach the harness only when ``thinkingConfig.includeThoughts``
  is true, as from the real API. Function calls are emitted whole (Gemini
  never streams partial arguments), each with an ``id``.
* ``countTokens`` is answered from the policy tokenizer in tokens mode
  (:meth:`GeminiCodec.parse_count_request`, :meth:`~GeminiCodec.count_response`).
* Non-function tools (``googleSearch``, ``codeExecution``...) are not
  modelled: the raw ``tools`` array is then kept in ``ChatRequest.extra``,
  as are the ``generationConfig`` fields the canonical model lacks
  (``topK``, ``thinkingConfig``, ``responseSchema``...).
"""

from __future__ import annotations

import functools
import json
import re
import urllib.parse
from typing import Any

from openforge.wire import conversation as conv
from openforge.wire import sse
from openforge.wire.codecs import fields, ids
from openforge.wire.codecs.errors import CodecError

GENERATE = "generateContent"
STREAM = "streamGenerateContent"
COUNT = "countTokens"
_ROUTE = re.compile(
    r"(?:^|/)(?:(?:models|tunedModels)/)?([^/]*):(generateContent|streamGenerateContent|countTokens)$"
)
_DATA_KEYS = (
    "text", "inlineData", "fileData", "functionCall", "functionResponse",
    "executableCode", "codeExecutionResult",
)  # fmt: skip
_MODELLED = frozenset(
    {
        "contents", "systemInstruction", "system_instruction", "tools", "toolConfig",
        "tool_config", "generationConfig", "generation_config",
    }
)  # fmt: skip
_SAMPLING = ("temperature", "topP", "maxOutputTokens", "stopSequences", "seed")
_FINISH_OUT: dict[conv.FinishReason, str] = {
    "stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP", "error": "OTHER",
}  # fmt: skip
_FAILED_CALLS = frozenset({"MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL"})
_STATUS = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
    404: "NOT_FOUND", 409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED", 500: "INTERNAL", 501: "UNIMPLEMENTED", 502: "UNAVAILABLE",
    503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}  # fmt: skip


# --- field names ------------------------------------------------------------


@functools.cache
def _snake(camel: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m.group().lower(), camel)


def _key(obj: dict[str, Any], camel: str) -> str:
    """The key ``obj`` spells ``camel`` with (camelCase unless only snake_case is there)."""
    if camel not in obj:
        snake = _snake(camel)
        if snake in obj:
            return snake
    return camel


def _at(obj: dict[str, Any], camel: str, *, path: str) -> tuple[Any, str]:
    """The value of ``camel`` in ``obj`` (None when absent) and its JSON path."""
    key = _key(obj, camel)
    return obj.get(key), fields.join(path, key)


def _part_kind(part: dict[str, Any], path: str) -> str:
    """Which data a part holds: one of ``_DATA_KEYS``, or "thought" for a bare signature."""
    for camel in _DATA_KEYS:
        if _key(part, camel) in part:
            return camel
    if part.get("thought") is True:
        return "thought"
    raise CodecError(f"a part needs one of {', '.join(_DATA_KEYS)}", field=path)


# --- requests -------------------------------------------------------------------


def _media(part: dict[str, Any], kind: str, *, path: str) -> conv.ImagePart:
    """An ``inlineData`` or ``fileData`` image, kept exactly as sent."""
    value, at = _at(part, kind, path=path)
    blob = fields.as_object(value, at)
    mime_key = _key(blob, "mimeType")
    if kind == "inlineData":
        mime = fields.req_str(blob, mime_key, path=at)
        url = f"data:{mime};base64,{fields.req_str(blob, 'data', path=at)}"
    else:
        mime = fields.opt_str(blob, mime_key, path=at) or ""
        url = fields.req_str(blob, _key(blob, "fileUri"), path=at)
    if mime and not mime.startswith("image/"):
        raise CodecError(
            f"unsupported {kind} mimeType {mime!r}: the policy reads text and images only",
            field=fields.join(at, mime_key),
        )
    return conv.ImagePart(url)


def _text(part: dict[str, Any], path: str) -> tuple[str, bool, str | None]:
    """A text or thought part: its text, whether it is a thought, its signature."""
    text = fields.opt_str(part, "text", path=path) or ""
    thought = bool(fields.opt_bool(part, "thought", path=path))
    signature = fields.opt_str(part, _key(part, "thoughtSignature"), path=path) or None
    return text, thought, signature


def _function_call(part: dict[str, Any], path: str, *, fallback_id: str) -> conv.ToolCallPart:
    value, at = _at(part, "functionCall", path=path)
    call = fields.as_object(value, at)
    args = call.get("args")
    arguments = {} if args is None else fields.as_object(args, fields.join(at, "args"))
    call_id = fields.opt_str(call, "id", path=at) or fallback_id
    return conv.ToolCallPart(
        call_id, fields.req_str(call, "name", path=at), fields.dumps(arguments)
    )


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else fields.dumps(value)


def _result_text(payload: dict[str, Any]) -> tuple[str, bool]:
    """The result text and whether it reports an error.

    Google documents ``output`` for a function's output and ``error`` for
    its error; a response with other keys is the output as a whole.
    """
    if payload and set(payload) <= {"output", "error"}:
        texts = [_as_text(payload[k]) for k in ("output", "error") if k in payload]
        return "\n".join(texts), "error" in payload
    return fields.dumps(payload), False


def _claim(pending: list[tuple[str, str]], call_id: str | None, *, name: str) -> str | None:
    """Mark a call answered; the id of the earliest unanswered call of ``name`` if none given."""
    for index, (pending_id, pending_name) in enumerate(pending):
        if pending_id == call_id or (call_id is None and pending_name == name):
            del pending[index]
            return pending_id
    return call_id


def _function_response(
    part: dict[str, Any], path: str, *, pending: list[tuple[str, str]], fallback_id: str
) -> conv.ToolResultPart:
    value, at = _at(part, "functionResponse", path=path)
    response = fields.as_object(value, at)
    name = fields.req_str(response, "name", path=at)
    payload = fields.as_object(fields.required(response, "response", path=at), f"{at}.response")
    call_id = _claim(pending, fields.opt_str(response, "id", path=at), name=name) or fallback_id
    text, is_error = _result_text(payload)
    content: list[conv.TextPart | conv.ImagePart] = [conv.TextPart(text)] if text else []
    nested = response.get("parts")
    for k, raw in enumerate([] if nested is None else fields.as_list(nested, f"{at}.parts")):
        nested_at = f"{at}.parts[{k}]"
        nested_part = fields.as_object(raw, nested_at)
        kind = _part_kind(nested_part, nested_at)
        if kind not in ("inlineData", "fileData"):
            raise fields.unsupported(
                "function response part", kind, path=fields.join(nested_at, kind)
            )
        content.append(_media(nested_part, kind, path=nested_at))
    return conv.ToolResultPart(call_id, tuple(content), is_error=is_error, name=name)


def _model_turn(
    parts: list[Any], path: str, *, turn: int
) -> tuple[conv.Message, list[tuple[str, str]]]:
    """The assistant message of a ``model`` turn and its calls, as (id, name)."""
    out: list[conv.Part] = []
    calls: list[tuple[str, str]] = []
    for j, raw in enumerate(parts):
        at = f"{path}[{j}]"
        part = fields.as_object(raw, at)
        kind = _part_kind(part, at)
        if kind == "functionCall":
            call = _function_call(part, at, fallback_id=f"call_{turn}_{j}")
            out.append(call)
            calls.append((call.id, call.name))
        elif kind in ("text", "thought"):
            text, thought, signature = _text(part, at)
            out.append(conv.ReasoningPart(text, signature) if thought else conv.TextPart(text))
        else:
            raise fields.unsupported("model part", kind, path=fields.join(at, _key(part, kind)))
    return conv.Message("assistant", tuple(out)), calls


def _user_turn(
    parts: list[Any], path: str, *, turn: int, pending: list[tuple[str, str]]
) -> list[conv.Message]:
    """A ``user`` turn: one ``tool`` message per function response, then the rest."""
    results: list[conv.Message] = []
    rest: list[conv.Part] = []
    for j, raw in enumerate(parts):
        at = f"{path}[{j}]"
        part = fields.as_object(raw, at)
        kind = _part_kind(part, at)
        if kind in ("text", "thought"):
            rest.append(conv.TextPart(_text(part, at)[0]))
        elif kind in ("inlineData", "fileData"):
            rest.append(_media(part, kind, path=at))
        elif kind == "functionResponse":
            result = _function_response(part, at, pending=pending, fallback_id=f"call_{turn}_{j}")
            results.append(conv.Message("tool", (result,)))
        else:
            raise fields.unsupported("user part", kind, path=fields.join(at, _key(part, kind)))
    if rest or not results:
        results.append(conv.Message("user", tuple(rest)))
    return results


def _contents(obj: dict[str, Any], path: str) -> list[conv.Message]:
    key = _key(obj, "contents")
    at = fields.join(path, key)
    contents = fields.req_list(obj, key, path=path)
    if not contents:
        raise CodecError("must hold at least one content", field=at)
    messages: list[conv.Message] = []
    pending: list[tuple[str, str]] = []
    for i, raw in enumerate(contents):
        turn_at = f"{at}[{i}]"
        content = fields.as_object(raw, turn_at)
        role = fields.opt_str(content, "role", path=turn_at) or "user"
        parts = fields.req_list(content, "parts", path=turn_at)
        if role == "model":
            message, pending = _model_turn(parts, f"{turn_at}.parts", turn=i)
            messages.append(message)
        elif role in ("user", "function"):  # "function": the older API's turns of responses
            messages.extend(_user_turn(parts, f"{turn_at}.parts", turn=i, pending=pending))
        else:
            raise fields.unsupported("role", role, path=f"{turn_at}.role")
    return messages


def _system(obj: dict[str, Any], path: str) -> list[conv.Message]:
    value, at = _at(obj, "systemInstruction", path=path)
    if value is None:
        return []
    content = fields.as_object(value, at)
    texts = []
    for j, raw in enumerate(fields.req_list(content, "parts", path=at)):
        part_at = f"{at}.parts[{j}]"
        part = fields.as_object(raw, part_at)
        kind = _part_kind(part, part_at)
        if kind != "text":
            raise fields.unsupported(
                "system instruction part", kind, path=fields.join(part_at, kind)
            )
        texts.append(conv.TextPart(fields.req_str(part, "text", path=part_at)))
    return [conv.Message("system", tuple(texts))] if texts else []


def _declaration(raw: Any, path: str) -> conv.Tool:
    decl = fields.as_object(raw, path)
    schema_key = _key(decl, "parametersJsonSchema")
    if schema_key not in decl:
        schema_key = "parameters"  # an OpenAPI-style schema, kept as sent
    schema = decl.get(schema_key)
    return conv.Tool(
        fields.req_str(decl, "name", path=path),
        fields.opt_str(decl, "description", path=path) or "",
        {} if schema is None else fields.as_object(schema, fields.join(path, schema_key)),
    )


def _tools(obj: dict[str, Any], path: str) -> tuple[tuple[conv.Tool, ...], bool]:
    """The function declarations, and whether other (built-in) tools were offered."""
    value, at = _at(obj, "tools", path=path)
    if value is None:
        return (), False
    tools: list[conv.Tool] = []
    others = False
    for i, raw in enumerate(fields.as_list(value, at)):
        tool_at = f"{at}[{i}]"
        tool = fields.as_object(raw, tool_at)
        key = _key(tool, "functionDeclarations")
        others = others or bool(set(tool) - {key})
        declarations = tool.get(key)
        if declarations is None:
            continue
        decls_at = fields.join(tool_at, key)
        for j, decl in enumerate(fields.as_list(declarations, decls_at)):
            tools.append(_declaration(decl, f"{decls_at}[{j}]"))
    return tuple(tools), others


def _tool_choice(obj: dict[str, Any], path: str) -> str:
    value, at = _at(obj, "toolConfig", path=path)
    if value is None:
        return "auto"
    config, config_at = _at(fields.as_object(value, at), "functionCallingConfig", path=at)
    if config is None:
        return "auto"
    calling = fields.as_object(config, config_at)
    mode = fields.opt_str(calling, "mode", path=config_at) or "AUTO"
    names_value, names_at = _at(calling, "allowedFunctionNames", path=config_at)
    names = [] if names_value is None else fields.as_list(names_value, names_at)
    names = [fields.as_str(name, f"{names_at}[{k}]") for k, name in enumerate(names)]
    if mode in ("AUTO", "VALIDATED", "MODE_UNSPECIFIED"):
        return "auto"
    if mode == "NONE":
        return "none"
    if mode == "ANY":
        return names[0] if len(names) == 1 else "required"
    raise fields.unsupported("function calling mode", mode, path=fields.join(config_at, "mode"))


def _check_thinking(config: dict[str, Any], path: str) -> None:
    value, at = _at(config, "thinkingConfig", path=path)
    if value is None:
        return
    thinking = fields.as_object(value, at)
    fields.opt_bool(thinking, _key(thinking, "includeThoughts"), path=at)
    fields.opt_int(thinking, _key(thinking, "thinkingBudget"), path=at)
    fields.opt_str(thinking, _key(thinking, "thinkingLevel"), path=at)


def _generation(obj: dict[str, Any], path: str) -> tuple[conv.SamplingParams, str, dict[str, Any]]:
    """Sampling params, and the config's key and other fields (kept in ``extra``)."""
    key = _key(obj, "generationConfig")
    value, at = obj.get(key), fields.join(path, key)
    if value is None:
        return conv.SamplingParams(), key, {}
    config = fields.as_object(value, at)
    keys = {camel: _key(config, camel) for camel in _SAMPLING}
    max_tokens = fields.opt_int(config, keys["maxOutputTokens"], path=at, minimum=1)
    _check_thinking(config, at)
    sampling = conv.SamplingParams(
        max_tokens=max_tokens,
        temperature=fields.opt_number(config, keys["temperature"], path=at, minimum=0, maximum=2),
        top_p=fields.opt_number(config, keys["topP"], path=at, minimum=0, maximum=1),
        stop=fields.stop_list(config, keys["stopSequences"], path=at),
        seed=fields.opt_int(config, keys["seed"], path=at),
    )
    rest = {k: v for k, v in config.items() if k not in keys.values()}
    return sampling, key, rest


def _request(obj: dict[str, Any], *, model: str, stream: bool, path: str) -> conv.ChatRequest:
    messages = [*_system(obj, path), *_contents(obj, path)]
    tools, others = _tools(obj, path)
    sampling, config_key, config_rest = _generation(obj, path)
    extra = fields.rest(obj, _MODELLED)
    if others:
        extra[_key(obj, "tools")] = obj[_key(obj, "tools")]
    if config_rest:
        extra[config_key] = config_rest
    return conv.ChatRequest(
        api=conv.WireApi.GEMINI,
        model=model,
        messages=tuple(messages),
        tools=tools,
        tool_choice=_tool_choice(obj, path),
        sampling=sampling,
        stream=stream,
        extra=extra,
    )


def _include_thoughts(request: conv.ChatRequest) -> bool:
    config = request.extra.get("generationConfig", request.extra.get("generation_config")) or {}
    thinking = config.get("thinkingConfig", config.get("thinking_config")) or {}
    return thinking.get("includeThoughts", thinking.get("include_thoughts")) is True


# --- responses --------------------------------------------------------------------


def _usage(usage: conv.Usage) -> dict[str, int]:
    return {
        "promptTokenCount": usage.prompt_tokens,
        "candidatesTokenCount": usage.completion_tokens,
        "totalTokenCount": usage.total_tokens,
    }


def _call_part(call_id: str, name: str, *, arguments: str) -> dict[str, Any]:
    parsed = conv.ToolCallPart(call_id, name, arguments).parsed_arguments() if arguments else {}
    # The API admits only objects; the tool-call parser is expected to produce them.
    args = parsed if isinstance(parsed, dict) else {}
    return {"functionCall": {"id": call_id, "name": name, "args": args}}


def _part(part: conv.Part, thoughts: bool) -> dict[str, Any] | None:
    if isinstance(part, conv.TextPart) and part.text:
        return {"text": part.text}
    if isinstance(part, conv.ReasoningPart) and thoughts and (part.text or part.signature):
        out: dict[str, Any] = {"text": part.text, "thought": True}
        if part.signature:
            out["thoughtSignature"] = part.signature
        return out
    if isinstance(part, conv.ToolCallPart):
        return _call_part(part.id, part.name, arguments=part.arguments)
    return None


def _candidate(parts: list[dict[str, Any]], finish: str | None = None) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}}
    if finish is not None:
        candidate["finishReason"] = finish
    candidate["index"] = 0
    return candidate


def _finish_in(reason: str | None, has_calls: bool) -> conv.FinishReason:
    if reason == "MAX_TOKENS":
        return "length"
    if reason in _FAILED_CALLS:
        return "error"
    return "tool_calls" if has_calls else "stop"


def _parse_usage(obj: dict[str, Any]) -> conv.Usage | None:
    value, at = _at(obj, "usageMetadata", path="")
    if value is None:
        return None
    usage = fields.as_object(value, at)

    def count(camel: str) -> int:
        return fields.opt_int(usage, _key(usage, camel), path=at) or 0

    generated = count("candidatesTokenCount") + count("thoughtsTokenCount")
    return conv.Usage(count("promptTokenCount"), generated)


def _first_candidate(obj: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The candidate with index 0 (the only one the canonical model holds), and its path."""
    value = obj.get("candidates")
    candidates = [] if value is None else fields.as_list(value, "candidates")
    for i, raw in enumerate(candidates):
        candidate = fields.as_object(raw, f"candidates[{i}]")
        if candidate.get("index", 0) == 0:
            return candidate, f"candidates[{i}]"
    return None, ""


def _response_parts(candidate: dict[str, Any] | None, path: str) -> list[tuple[str, Any]]:
    """The candidate's parts as ("text" | "thought", (text, signature)) or ("call", dict)."""
    if candidate is None:
        return []
    value, at = _at(candidate, "content", path=path)
    content = {} if value is None else fields.as_object(value, at)
    raw_parts = content.get("parts")
    out: list[tuple[str, Any]] = []
    for j, raw in enumerate([] if raw_parts is None else fields.as_list(raw_parts, f"{at}.parts")):
        part_at = f"{at}.parts[{j}]"
        part = fields.as_object(raw, part_at)
        call_value, call_at = _at(part, "functionCall", path=part_at)
        if call_value is not None:
            call = fields.as_object(call_value, call_at)
            args = call.get("args")
            out.append(("call", {
                "id": fields.opt_str(call, "id", path=call_at),
                "name": fields.req_str(call, "name", path=call_at),
                "args": {} if args is None else fields.as_object(args, f"{call_at}.args"),
            }))  # fmt: skip
        elif "text" in part or part.get("thought") is True:
            text, thought, signature = _text(part, part_at)
            if text or signature:
                out.append(("thought" if thought else "text", (text, signature)))
    return out  # inline data and code execution parts have no canonical form


def _chunk(body: dict[str, Any]) -> bytes:
    """One SSE event exactly as Google frames it."""
    return b"data: " + fields.dumps(body).encode() + b"\r\n\r\n"


class _Encoder:
    """One chunk per text or thought delta; each function call whole, once complete."""

    def __init__(self, request: conv.ChatRequest, response_id: str) -> None:
        self._tail = {"modelVersion": request.model, "responseId": response_id}
        self._thoughts = _include_thoughts(request)
        self._call: tuple[int, str, str, list[str]] | None = None  # index, id, name, arguments
        self._has_calls = False

    def start(self) -> bytes:
        return b""

    def encode(self, event: conv.StreamEvent) -> bytes:
        if isinstance(event, conv.ReasoningSignature):
            return b""  # this API's reasoning carries no signature
        if isinstance(event, conv.TextDelta | conv.ReasoningDelta):
            out = self._flush()
            part = _part(
                conv.TextPart(event.text)
                if isinstance(event, conv.TextDelta)
                else conv.ReasoningPart(event.text),
                self._thoughts,
            )
            return out + (self._emit([part]) if part is not None else b"")
        if isinstance(event, conv.ToolCallStart):
            out = self._flush()
            self._has_calls = True
            self._call = (event.index, event.id, event.name, [])
            return out
        if isinstance(event, conv.ToolCallArgumentsDelta):
            if self._call is not None and self._call[0] == event.index:
                self._call[3].append(event.arguments)
            return b""
        return self._end(event)

    def _emit(
        self,
        parts: list[dict[str, Any]],
        finish: str | None = None,
        *,
        usage: conv.Usage | None = None,
    ) -> bytes:
        body: dict[str, Any] = {"candidates": [_candidate(parts, finish)]}
        if usage is not None:
            body["usageMetadata"] = _usage(usage)
        return _chunk({**body, **self._tail})

    def _pending(self) -> list[dict[str, Any]]:
        if self._call is None:
            return []
        _, call_id, name, arguments = self._call
        self._call = None
        return [_call_part(call_id, name, arguments="".join(arguments))]

    def _flush(self) -> bytes:
        parts = self._pending()
        return self._emit(parts) if parts else b""

    def _end(self, event: conv.StreamEnd) -> bytes:
        parts = self._pending()
        if event.finish_reason == "error":
            out = self._emit(parts) if parts else b""
            error = {
                "code": 500,
                "message": "the model failed while generating",
                "status": "INTERNAL",
            }
            return out + _chunk({"error": error})
        finish = _FINISH_OUT[event.finish_reason]
        return self._emit(parts, finish, usage=event.usage)


class _Decoder:
    """Gemini streams have no closing event: the chunk with a ``finishReason`` ends them."""

    def __init__(self, codec: GeminiCodec) -> None:
        self._codec = codec
        self._calls = 0
        self._usage = conv.Usage()
        self._ended = False

    def feed(self, event: sse.Event) -> list[conv.StreamEvent]:
        if self._ended:
            return []
        try:
            body = fields.as_object(json.loads(event.data), "")
        except (ValueError, RecursionError) as exc:
            raise CodecError(f"stream chunk is not a JSON object: {exc}") from None
        if "error" in body:
            self._ended = True
            return [conv.StreamEnd("error", self._usage)]
        candidate, at = _first_candidate(body)
        response_id = fields.opt_str(body, _key(body, "responseId"), path="") or ""
        out: list[conv.StreamEvent] = []
        for kind, value in _response_parts(candidate, at):
            if kind == "call":
                call_id = value["id"] or self._codec.tool_call_id(f"{response_id}/{self._calls}")
                out.append(conv.ToolCallStart(self._calls, call_id, value["name"]))
                out.append(conv.ToolCallArgumentsDelta(self._calls, fields.dumps(value["args"])))
                self._calls += 1
            elif value[0]:
                out.append(
                    conv.TextDelta(value[0]) if kind == "text" else conv.ReasoningDelta(value[0])
                )
        self._usage = _parse_usage(body) or self._usage
        reason = None if candidate is None else candidate.get(_key(candidate, "finishReason"))
        if reason is not None:
            self._ended = True
            finish = _finish_in(fields.as_str(reason, f"{at}.finishReason"), self._calls > 0)
            out.append(conv.StreamEnd(finish, self._usage))
        return out


class GeminiCodec:
    """The Gemini API as served at one path: model and method come from the URL."""

    api: conv.WireApi = conv.WireApi.GEMINI
    paths: tuple[str, ...] = (f":{GENERATE}", f":{STREAM}")

    def __init__(self, *, model: str = "", method: str = GENERATE, sse: bool = False) -> None:
        self.model = model
        self.method = method
        self.sse = sse

    def parse_request(self, body: bytes) -> conv.ChatRequest:
        stream = self.method == STREAM
        if stream and not self.sse:
            raise CodecError(
                f"{STREAM} is served as server-sent events only: add ?alt=sse to the URL",
                field="alt",
            )
        return _request(fields.load_object(body), model=self.model, stream=stream, path="")

    def parse_count_request(self, body: bytes) -> conv.ChatRequest:
        """A ``countTokens`` body: ``contents``, or a whole ``generateContentRequest``."""
        obj = fields.load_object(body)
        inner, at = _at(obj, "generateContentRequest", path="")
        if inner is not None:
            obj = fields.as_object(inner, at)
        return _request(obj, model=self.model, stream=False, path="" if inner is None else at)

    def count_response(self, total_tokens: int) -> dict[str, Any]:
        return {"totalTokens": total_tokens}

    def build_response(
        self,
        request: conv.ChatRequest,
        completion: conv.Completion,
        *,
        response_id: str,
        created: int,
    ) -> dict[str, Any]:
        thoughts = _include_thoughts(request)
        parts = [p for p in (_part(part, thoughts) for part in completion.message.parts) if p]
        return {
            "candidates": [_candidate(parts, _FINISH_OUT[completion.finish_reason])],
            "usageMetadata": _usage(completion.usage),
            "modelVersion": request.model,
            "responseId": response_id,
        }

    def stream_encoder(
        self, request: conv.ChatRequest, *, response_id: str, created: int, prompt_tokens: int = 0
    ) -> _Encoder:
        del prompt_tokens  # this API reports usage only at the end
        return _Encoder(request, response_id)

    def parse_response(self, body: bytes) -> conv.Completion:
        obj = fields.load_object(body)
        candidate, at = _first_candidate(obj)
        response_id = fields.opt_str(obj, _key(obj, "responseId"), path="") or ""
        parts: list[conv.Part] = []
        calls = 0
        for kind, value in _response_parts(candidate, at):
            if kind == "call":
                call_id = value["id"] or self.tool_call_id(f"{response_id}/{calls}")
                calls += 1
                parts.append(conv.ToolCallPart(call_id, value["name"], fields.dumps(value["args"])))
            elif kind == "thought":
                parts.append(conv.ReasoningPart(*value))
            else:
                parts.append(conv.TextPart(value[0]))
        reason = None if candidate is None else candidate.get(_key(candidate, "finishReason"))
        finish = _finish_in(
            None if reason is None else fields.as_str(reason, f"{at}.finishReason"), calls > 0
        )
        return conv.Completion(
            conv.Message("assistant", tuple(parts)), finish, _parse_usage(obj) or conv.Usage()
        )

    def stream_decoder(self) -> _Decoder:
        return _Decoder(self)

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = _STATUS.get(status) or ("INTERNAL" if status >= 500 else "FAILED_PRECONDITION")
        return {"error": {"code": status, "message": message, "status": kind}}

    def tool_call_id(self, seed: str) -> str:
        return ids.derive("call_", seed)


def _route(path: str) -> tuple[str, str, bool] | None:
    """(model, method, alt=sse) of a Gemini API path, or None for any other path."""
    bare, _, query = path.partition("?")
    match = _ROUTE.search(bare.rstrip("/"))
    if match is None:
        return None
    alt = urllib.parse.parse_qs(query).get("alt", [""])[-1]
    return urllib.parse.unquote(match[1]), match[2], alt == "sse"


def for_path(path: str) -> GeminiCodec | None:
    """The codec for a ``generateContent`` or ``streamGenerateContent`` path."""
    route = _route(path)
    if route is None or route[1] == COUNT:
        return None
    model, method, alt_sse = route
    return GeminiCodec(model=model, method=method, sse=alt_sse)


def counter_for_path(path: str) -> GeminiCodec | None:
    """The codec for a ``countTokens`` path."""
    route = _route(path)
    if route is None or route[1] != COUNT:
        return None
    return GeminiCodec(model=route[0], method=COUNT)


CODEC = GeminiCodec()
