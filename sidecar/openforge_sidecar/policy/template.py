"""The policy's tokenizer and chat template: conversation in, token IDs out.

A :class:`PolicyTokenizer` is what the sidecar knows of the policy's text
side. It renders canonical :class:`~openforge.wire.conversation.Message`
values through the policy's own Jinja chat template (from its HF-style
``tokenizer_config.json``), encodes the prompt text to token IDs, and turns
generated IDs back into text, incrementally while streaming.

The template runs in a sandboxed Jinja environment configured the way
``transformers`` configures its own (trim_blocks, lstrip_blocks, its ``tojson``
filter), so the same template renders the same text here as in a trainer
that uses ``apply_chat_template``. It is compiled once per tokenizer.
"""

from __future__ import annotations

import codecs
import itertools
import json
import urllib.request
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from openforge import chat_template, endpoints
from openforge.wire import conversation
from tokenizers import Tokenizer, decoders

from openforge_sidecar import memory
from openforge_sidecar.policy import segments, stored

IMAGE_PLACEHOLDER = "<image>"
# Stop tokens of the ChatML family, whichever of them the vocabulary has.
_CHATML_STOPS = ("<|im_end|>", "<|endoftext|>")
_FETCH_TIMEOUT_S = 30.0


#: A prompt up to this many characters is rendered whole, then encoded (a few tens of
#: microseconds sooner than chunk by chunk); a longer one never is (:meth:`render_ids`).
#: A count of characters, as many as a large call's bytes: a prompt this long is about
#: a body that large.
WHOLE_PROMPT_CHARS = memory.LARGE_BYTES


class PolicyTokenizer:
    """A policy's tokenizer plus chat template, loaded once and reused."""

    def __init__(self, *, tokenizer: Tokenizer, config: dict[str, Any]) -> None:
        self._tokenizer = tokenizer
        self._template = chat_template.environment().from_string(_chat_template(config))
        self.eos_token = _token_text(config.get("eos_token"), "eos_token")
        stops = {self._token_id(self.eos_token)}
        stops.update(self._token_id(t) for t in _CHATML_STOPS if self._has_token(t))
        self.stop_token_ids: frozenset[int] = frozenset(stops)
        self._byte_table: list[bytes] | None = _byte_table(tokenizer)
        self._segments = segments.SegmentEncoder.for_tokenizer(tokenizer, self._encode_batch)

    @classmethod
    def load(cls, source: str) -> PolicyTokenizer:
        """Load from a directory, or from an engine URL serving the tokenizer files."""
        if source.startswith(("http://", "https://")):
            base = source.rstrip("/") + endpoints.TOKENIZER
            return cls.from_texts(
                tokenizer_json=_fetch(f"{base}/tokenizer.json"),
                config_json=_fetch(f"{base}/tokenizer_config.json"),
            )
        directory = Path(source)
        if not directory.is_dir():
            raise FileNotFoundError(f"tokenizer directory {source!r} does not exist")
        return cls.from_texts(
            tokenizer_json=(directory / "tokenizer.json").read_text(encoding="utf-8"),
            config_json=(directory / "tokenizer_config.json").read_text(encoding="utf-8"),
        )

    @classmethod
    def from_texts(cls, *, tokenizer_json: str, config_json: str) -> PolicyTokenizer:
        try:
            config = json.loads(config_json)
        except ValueError as error:
            raise ValueError(f"tokenizer_config.json is not JSON: {error}") from error
        if not isinstance(config, dict):
            raise ValueError("tokenizer_config.json must hold a JSON object")
        return cls(tokenizer=Tokenizer.from_str(tokenizer_json), config=config)

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def render(
        self,
        messages: Sequence[conversation.Message],
        tools: Sequence[conversation.Tool],
        *,
        add_generation_prompt: bool,
    ) -> str:
        """The prompt text for a conversation, exactly as the chat template writes it."""
        context = self._context(messages, tools, add_generation_prompt=add_generation_prompt)
        return self._template.render(**context)

    def render_ids(
        self,
        messages: Sequence[conversation.Message],
        tools: Sequence[conversation.Tool],
        *,
        add_generation_prompt: bool,
        spill: Path | None = None,
    ) -> stored.Ids:
        """``encode_ids(render(...))``; past :data:`WHOLE_PROMPT_CHARS`, the template's
        text encoded as it is written, where the tokenizer is encoded in pieces
        (``SegmentEncoder.encode_chunks``): a long prompt's whole text is never made,
        only each piece's (a 10 MB conversation's text is 10 MB beside its messages
        and its IDs); and with ``spill``, its IDs past ``stored.SPILL_IDS`` go to that
        file as they are made."""
        context = self._context(messages, tools, add_generation_prompt=add_generation_prompt)
        if self._segments is None:
            return self.encode_ids(self._template.render(**context))
        chunks = self._template.generate(**context)
        head: list[str] = []  # a short prompt is joined and encoded whole: sooner
        size = 0
        for chunk in chunks:
            head.append(chunk)
            size += len(chunk)
            if size > WHOLE_PROMPT_CHARS:
                head.reverse()  # let go of as they are encoded
                return self._segments.encode_chunks(
                    itertools.chain(_popped(head), chunks), spill=spill
                )
        return self._segments.encode_ids("".join(head))

    def _context(
        self,
        messages: Sequence[conversation.Message],
        tools: Sequence[conversation.Tool],
        *,
        add_generation_prompt: bool,
    ) -> dict[str, Any]:
        return {
            "messages": [_message_dict(m, i) for i, m in enumerate(messages)],
            "tools": [_tool_dict(t) for t in tools] or None,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": "",
            "eos_token": self.eos_token,
        }

    def encode(self, text: str) -> list[int]:
        """Token IDs for ``text``; special tokens in it are recognised, none are added.

        Where the tokenizer allows it (:mod:`openforge_sidecar.policy.segments`), the
        pieces between special tokens are encoded once and reused: the system
        prompt and tools of every call, each earlier message of a conversation.
        """
        if self._segments is not None:
            return self._segments.encode(text)
        return list(self._encode_batch([text])[0])

    def _encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token IDs of each text on its own.

        ``encode_batch_fast`` gives the same IDs as ``encode`` without working
        out character offsets, which nothing here uses: a quarter to a third
        less time on a prompt, and a new conversation's whole prompt is
        encoded before its first token can be asked for. (Batch calls may use
        a thread pool; ``openforge sidecar`` sets ``TOKENIZERS_PARALLELISM``
        to false, so the texts stay on the calling thread.)
        """
        return [e.ids for e in self._tokenizer.encode_batch_fast(texts, add_special_tokens=False)]

    def encode_ids(self, text: str) -> array[int]:
        """:meth:`encode` as an array (4 bytes a token), built without a list where
        the pieces are cached (a 10 MB prompt's list would be ~70 MB of int objects)."""
        if self._segments is not None:
            return self._segments.encode_ids(text)
        return array("i", self._encode_batch([text])[0])

    def decode(self, ids: Sequence[int]) -> str:
        """Text for ``ids``, special tokens included."""
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))

    def token_bytes(self, token_id: int) -> bytes | None:
        """The bytes a token stands for, or None when the tokenizer is not byte-level."""
        if self._byte_table is None:
            return None
        if not 0 <= token_id < len(self._byte_table):
            raise ValueError(f"token id {token_id} is outside the vocabulary")
        return self._byte_table[token_id]

    def _has_token(self, token: str) -> bool:
        return self._tokenizer.token_to_id(token) is not None

    def _token_id(self, token: str) -> int:
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            raise ValueError(f"token {token!r} is not in the tokenizer's vocabulary")
        return int(token_id)


def _popped(items: list[str]) -> Iterator[str]:
    """``reversed(items)``, each taken off the list as it is given."""
    while items:
        yield items.pop()


class IncrementalDetokenizer:
    """Turns generated token IDs into text deltas as they arrive.

    The concatenated deltas plus :meth:`flush` equal ``decode`` of all the IDs,
    special tokens included. A character whose UTF-8 bytes span several
    byte-level tokens comes out whole, with the token that completes it. For
    byte-level tokenizers each token maps to fixed bytes fed to an incremental
    UTF-8 decoder; for others we re-decode a short trailing window, as vLLM
    does, and hold back text that still ends in a replacement character.
    """

    def __init__(self, tokenizer: PolicyTokenizer) -> None:
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def push(self, token_id: int) -> str:
        raw = self._tokenizer.token_bytes(token_id)
        if raw is not None:
            return str(self._utf8.decode(raw))
        self._ids.append(token_id)
        prefix, text = self._window()
        if len(text) > len(prefix) and not text.endswith("\ufffd"):
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
            return text[len(prefix) :]
        return ""

    def flush(self) -> str:
        """The text still held back (an unfinished character), at end of output."""
        tail = str(self._utf8.decode(b"", final=True))
        if self._read_offset < len(self._ids):
            prefix, text = self._window()
            tail += text[len(prefix) :]
            self._prefix_offset = self._read_offset = len(self._ids)
        return tail

    def _window(self) -> tuple[str, str]:
        start, read = self._prefix_offset, self._read_offset
        decode = self._tokenizer.decode
        return decode(self._ids[start:read]), decode(self._ids[start:])


# --- helpers ------------------------------------------------------------------


def _chat_template(config: dict[str, Any]) -> str:
    """The default chat template of a config (a string, or HF's named list)."""
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not isinstance(template, str) or not template:
        raise ValueError("tokenizer_config.json: chat_template is missing or not a string")
    return template


def _token_text(value: Any, field: str) -> str:
    """A special token from a config: a string, or HF's AddedToken-like object."""
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str) or not value:
        raise ValueError(f"tokenizer_config.json: {field} is missing or not a token string")
    return value


def _byte_table(tokenizer: Tokenizer) -> list[bytes] | None:
    """Each token's bytes, decoded as the ByteLevel decoder does; None if not byte-level.

    The decoder's type is read from the object: parsing the tokenizer's JSON
    for it would hold tens of MB for a real vocabulary at once, which would
    stay the process's peak resident size for its whole life.
    """
    if not isinstance(tokenizer.decoder, decoders.ByteLevel):
        return None
    byte_of = {char: byte for byte, char in _bytes_to_unicode().items()}
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    table = [b""] * (max(vocab.values(), default=-1) + 1)
    for token, token_id in vocab.items():
        table[token_id] = b"".join(
            bytes([byte_of[c]]) if c in byte_of else c.encode("utf-8") for c in token
        )
    return table


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=_FETCH_TIMEOUT_S) as response:
        return bytes(response.read()).decode("utf-8")


def _content_text(parts: Sequence[conversation.Part], where: str) -> str:
    """Text and image parts as template content; images become the placeholder."""
    out: list[str] = []
    for part in parts:
        if isinstance(part, conversation.TextPart):
            out.append(part.text)
        elif isinstance(part, conversation.ImagePart):
            out.append(IMAGE_PLACEHOLDER)
        else:
            raise ValueError(f"{where}: a {type(part).__name__} cannot appear here")
    return "".join(out)


def _message_dict(message: conversation.Message, index: int) -> dict[str, Any]:
    """A canonical message as the HF-style dict chat templates expect."""
    where = f"messages[{index}]"
    if message.role == "tool":
        return _tool_message_dict(message, where)
    if message.role != "assistant":
        return {"role": message.role, "content": _content_text(message.parts, where)}
    content = [
        p for p in message.parts if isinstance(p, conversation.TextPart | conversation.ImagePart)
    ]
    out: dict[str, Any] = {"role": "assistant", "content": _content_text(content, where)}
    reasoning = [p for p in message.parts if isinstance(p, conversation.ReasoningPart)]
    if reasoning:
        out["reasoning_content"] = "".join(p.text for p in reasoning)
    if message.tool_calls:
        out["tool_calls"] = [_tool_call_dict(call) for call in message.tool_calls]
    stray = [p for p in message.parts if isinstance(p, conversation.ToolResultPart)]
    if stray:
        raise ValueError(f"{where}: an assistant message cannot hold a tool result")
    return out


def _tool_message_dict(message: conversation.Message, where: str) -> dict[str, Any]:
    if len(message.parts) != 1 or not isinstance(message.parts[0], conversation.ToolResultPart):
        raise ValueError(f"{where}: a tool message must hold exactly one tool result")
    result = message.parts[0]
    out: dict[str, Any] = {
        "role": "tool",
        "tool_call_id": result.tool_call_id,
        "content": _content_text(result.content, f"{where}.content"),
    }
    if result.name is not None:
        out["name"] = result.name
    return out


def _tool_call_dict(call: conversation.ToolCallPart) -> dict[str, Any]:
    """Arguments go in parsed when they are a JSON object, else verbatim."""
    parsed = call.parsed_arguments()
    arguments = parsed if isinstance(parsed, dict) else call.arguments
    return {
        "type": "function",
        "id": call.id,
        "function": {"name": call.name, "arguments": arguments},
    }


def _tool_dict(tool: conversation.Tool) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }
