from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy import http
from openforge_sidecar.recording import redact


def test_headers_redacts_every_credential_and_keeps_the_rest():
    kept = redact.headers(
        [
            ("Authorization", "Bearer sk-secret"),
            ("x-api-key", "sk-ant-secret"),
            ("Cookie", "session=1"),
            ("Content-Type", "application/json"),
            ("anthropic-version", "2023-06-01"),
        ]
    )
    assert (
        "sk-secret" not in str(kept)
        and "sk-ant-secret" not in str(kept)
        and "session=1" not in str(kept)
    )
    assert kept["authorization"] == redact.REDACTED
    assert kept["content-type"] == "application/json"
    assert kept["anthropic-version"] == "2023-06-01"


def test_path_redacts_credential_query_parameters():
    out = redact.path("/v1beta/models/m:generateContent?key=AIzaSECRET&alt=sse")
    assert "AIzaSECRET" not in out
    assert "alt=sse" in out
    assert redact.path("/v1/messages") == "/v1/messages"


_names = st.sampled_from(
    [
        b"Authorization",
        b"authorization",
        b"X-Api-Key",
        b"Accept",
        b"accept",
        b"Host",
        b"x-\xc3\xa9",
        b"X-\xff",
    ]
)


@settings(deadline=None)
@given(st.lists(st.tuples(_names, st.binary(max_size=12)), max_size=10))
def test_header_fields_equal_headers_of_mitmproxys_items(fields: list[tuple[bytes, bytes]]) -> None:
    """The one-pass reading of raw fields gives exactly what mitmproxy's Headers.items() gives."""
    assert redact.header_fields(fields) == redact.headers(http.Headers(fields).items())


def test_headers_are_an_allow_list_a_credential_under_any_name_is_redacted() -> None:
    kept = redact.headers(
        [
            ("openai-api-key", "sk-1"), ("X-Auth-Token", "t-2"), ("x-my-gateway-credential", "g-3"),
            ("User-Agent", "codex/1.0"), ("x-stainless-lang", "js"),
            ("Accept", "text/event-stream"),
        ]
    )  # fmt: skip
    assert kept == {
        "openai-api-key": redact.REDACTED, "x-auth-token": redact.REDACTED,
        "x-my-gateway-credential": redact.REDACTED,
        "user-agent": "codex/1.0", "x-stainless-lang": "js", "accept": "text/event-stream",
    }  # fmt: skip


def test_top_level_credential_fields_of_a_body_are_redacted_and_the_conversation_kept() -> None:
    raw = (
        b'{"model": "m", "api_key": "sk-1", "accessToken": "t-2", "messages": [{"role": "user", '
        b'"content": "my password is p", "api_key": "in-content"}]}'
    )
    out = redact.body(raw, ["api_key", "accessToken"])
    assert b"sk-1" not in out and b"t-2" not in out
    assert b'"api_key":"[redacted]"' in out and b"in-content" in out and b"my password is p" in out
    assert redact.body(raw) == out  # a body the codec refused: the scan finds them too
    plain = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5}'
    assert (
        redact.body(plain, ["temperature"]) is plain and redact.body(plain) is plain
    )  # untouched bytes
    assert redact.body(b"not json, api_key: x") == b"not json, api_key: x"
