from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy import http
from openforge_sidecar import redact


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
    assert "sk-secret" not in str(kept) and "sk-ant-secret" not in str(kept) and "session=1" not in str(kept)
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
