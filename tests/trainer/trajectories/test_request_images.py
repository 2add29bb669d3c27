"""Images of a stored request, per wire API, in the order the sidecar renders them."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from openforge_trainer.trajectories import request_images

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))  # not a real image: bytes are bytes
B64 = base64.b64encode(PNG).decode()


#: The fields each API requires besides the conversation (the codecs refuse a body without them).
REQUIRED: dict[str, dict[str, Any]] = {
    "WIRE_API_OPENAI_CHAT": {"model": "m"},
    "WIRE_API_OPENAI_RESPONSES": {"model": "m"},
    "WIRE_API_ANTHROPIC_MESSAGES": {"model": "m", "max_tokens": 16},
    "WIRE_API_GEMINI": {},
}


def images(api: str, request: dict[str, Any]) -> list[str]:
    return request_images.request_images(api, json.dumps({**REQUIRED[api], **request}).encode())


def test_openai_chat_images_in_message_order_with_the_url_as_sent() -> None:
    request = {"messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "a"},
                                     {"type": "image_url",
                                      "image_url": {"url": f"data:image/png;base64,{B64}"}}]},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "tool_call_id": "c",
         "content": [{"type": "image_url",
                      "image_url": {"url": "https://x/y.png", "detail": "low"}}]},
        {"role": "user", "content": "plain text"},
    ]}  # fmt: skip
    urls = images("WIRE_API_OPENAI_CHAT", request)
    assert urls == [f"data:image/png;base64,{B64}", "https://x/y.png"]
    assert request_images.image_bytes(urls[0]) == PNG


def test_openai_responses_images_from_messages_and_tool_outputs() -> None:
    request = {"input": [
        {"role": "user",
         "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]},
        {"type": "function_call_output", "call_id": "c",
         "output": [{"type": "input_image", "image_url": "data:image/png;base64,BBBB"}]},
        {"type": "function_call_output", "call_id": "d", "output": "text only"},
    ]}  # fmt: skip
    assert images("WIRE_API_OPENAI_RESPONSES", request) == [
        "data:image/png;base64,AAAA", "data:image/png;base64,BBBB",
    ]  # fmt: skip


def test_anthropic_tool_result_images_come_before_the_turns_own() -> None:
    own = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "OWN="}}
    nested = {"type": "image", "source": {"type": "url", "url": "https://x/n.png"}}
    request = {"system": "s", "messages": [
        {"role": "user",
         "content": [own, {"type": "tool_result", "tool_use_id": "t", "content": [nested]}]},
        {"role": "user", "content": "text"},
    ]}  # fmt: skip
    assert images("WIRE_API_ANTHROPIC_MESSAGES", request) == [
        "https://x/n.png", "data:image/png;base64,OWN=",
    ]  # fmt: skip


def test_gemini_inline_and_file_data_in_both_spellings() -> None:
    request = {"contents": [
        {"role": "user", "parts": [{"inline_data": {"mime_type": "image/png", "data": "SNAKE="}},
                                   {"functionResponse": {"name": "f", "response": {}, "parts": [
                                       {"inlineData": {"mimeType": "image/png", "data": "NESTED="}},
                                   ]}}]},
        {"role": "user", "parts": [{"fileData": {"mimeType": "image/png", "fileUri": "gs://b/f.png"}},
                                   {"text": "t"}]},
    ]}  # fmt: skip
    assert images("WIRE_API_GEMINI", request) == [
        "data:image/png;base64,NESTED=", "data:image/png;base64,SNAKE=", "gs://b/f.png",
    ]  # fmt: skip


def test_no_body_no_images_and_bad_input_names_the_fault() -> None:
    assert request_images.request_images("WIRE_API_OPENAI_CHAT", b"") == []
    assert request_images.request_images("WIRE_API_UNSPECIFIED", b'{"messages": []}') == []
    with pytest.raises(request_images.ImageError, match="not valid JSON"):
        request_images.request_images("WIRE_API_OPENAI_CHAT", b"{nope")
    bad = {"type": "image_url", "image_url": {"detail": "low"}}
    with pytest.raises(request_images.ImageError, match=r"messages\[0\]\.content\[0\]\.image_url"):
        images("WIRE_API_OPENAI_CHAT", {"messages": [{"role": "user", "content": [bad]}]})
    with pytest.raises(request_images.ImageError, match="not a base64 data: URL"):
        request_images.image_bytes("https://x/y.png")
    with pytest.raises(request_images.ImageError, match="bad base64"):
        request_images.image_bytes("data:image/png;base64,!!!")
