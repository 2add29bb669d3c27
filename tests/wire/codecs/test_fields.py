"""Reading a request body: what is refused, and the path or byte named."""

from __future__ import annotations

import json

import pytest
from openforge.wire.codecs import fields
from openforge.wire.codecs.errors import CodecError


@pytest.mark.parametrize(
    "body",
    [
        b'{"messages": [{"content": "hi \\ud800"}]}',  # an escape
        b'{"messages": [{"content": "hi \xed\xa0\x80"}]}',  # its bytes, which are no UTF-8
        b'{"messages": [{"content": "hi"}], "\xed\xbf\xbf": 1}',  # in a key
    ],
)
def test_a_lone_surrogate_is_refused_however_it_is_spelt(body: bytes) -> None:
    with pytest.raises(CodecError, match="surrogate") as raised:
        fields.load_object(body)
    assert raised.value.field in ("messages[0].content", "\\udfff")  # a key: escaped


def test_bytes_that_are_no_utf8_are_refused_naming_the_byte() -> None:
    with pytest.raises(CodecError, match="0xff in position 28"):
        fields.load_object(b'{"messages": [{"content": "h\xff"}]}')


def test_valid_text_near_the_surrogates_is_taken() -> None:
    text = "\ud7ff \ue000 한국어 😀"  # the code points either side of them, Hangul, a pair
    body = json.dumps({"content": text}, ensure_ascii=False).encode()
    assert fields.load_object(body) == {"content": text}


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-16"])
def test_a_body_not_in_utf8_is_refused_naming_its_encoding(encoding: str) -> None:
    """JSON between systems is UTF-8 (RFC 8259); the stdlib's parser would read UTF-16
    and UTF-32 too, and a surrogate in them would pass the UTF-8 checks."""
    body = '{"messages": [{"content": "hi \\ud800"}]}'.encode(encoding)
    with pytest.raises(CodecError, match="UTF-8") as raised:
        fields.load_object(body)
    assert "utf-16" in str(raised.value) or "utf-32" in str(raised.value)


def test_a_byte_order_mark_before_utf8_is_taken() -> None:
    assert fields.load_object(b"\xef\xbb\xbf" + b'{"a": 1}') == {"a": 1}
