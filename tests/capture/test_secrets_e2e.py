"""No credential a harness sends reaches the spool, the store or the sidecar's log: a
real sidecar, the test engine and the collector, and a key in every place a harness can
put one (standard and made-up headers, cookies, query parameters, top-level body fields)
on each wire API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

SECRETS = [f"sekrit-{n}-do-not-store" for n in range(12)]
HEADERS = {
    "Authorization": f"Bearer {SECRETS[0]}",
    "x-api-key": SECRETS[1],
    "openai-api-key": SECRETS[2],
    "x-auth-token": SECRETS[3],
    "api-key": SECRETS[4],
    "x-my-gateway-credential": SECRETS[5],
    "Cookie": f"session={SECRETS[6]}",
    "Proxy-Authorization": f"Basic {SECRETS[7]}",
}
BODY_FIELDS = {"api_key": SECRETS[8], "accessToken": SECRETS[9], "client-secret": SECRETS[10]}
CALLS: list[tuple[str, dict[str, Any]]] = [
    (
        "/v1/chat/completions",
        {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    ),
    ("/v1/responses", {"model": "policy", "input": "hi", "max_output_tokens": 8}),
    (
        "/v1/messages",
        {"model": "policy", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    ),
    (
        f"/v1beta/models/policy:generateContent?key={SECRETS[11]}",
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
    ),
]


def send_every_call(sidecar: Any) -> None:
    for path, body in CALLS:
        response = httpx.post(
            f"{sidecar.url}{path}", json={**body, **BODY_FIELDS}, headers=HEADERS, timeout=60
        )
        assert response.status_code == 200, (path, response.text)


def found_in(*places: Path) -> list[str]:
    hits = []
    for place in places:
        for path in (
            [place] if place.is_file() else sorted(p for p in place.rglob("*") if p.is_file())
        ):
            data = path.read_bytes()
            hits += [f"{secret} in {path}" for secret in SECRETS if secret.encode() in data]
    return hits


def test_no_credential_reaches_the_spool_or_the_log(procs: Any, tmp_path: Path) -> None:
    engine = procs.engine()
    sidecar = procs.sidecar(
        "--job",
        "secrets",
        "--rollout-id",
        "r1",
        "--task-id",
        "t1",
        engine=engine,
        spool=tmp_path / "spool",
    )
    send_every_call(sidecar)  # no collector: every record stays in the spool
    sidecar.stop()
    spooled = sum(p.stat().st_size for p in (tmp_path / "spool").rglob("*") if p.is_file())
    assert spooled > 0
    assert found_in(tmp_path / "spool", sidecar.log) == []


def test_no_credential_reaches_the_store_and_the_header_names_stay(
    procs: Any, tmp_path: Path
) -> None:
    from openforge_trainer.collection import store

    engine = procs.engine()
    collector = procs.collector(tmp_path / "store.db")
    sidecar = procs.sidecar(
        "--collector", f"127.0.0.1:{collector.port}",
        "--job", "secrets", "--rollout-id", "r2", "--task-id", "t1",
        engine=engine, spool=tmp_path / "spool2",
    )  # fmt: skip
    send_every_call(sidecar)
    finished = httpx.post(
        f"{sidecar.url}/openforge/v1/rollout/finish",
        json={"exit_code": 0, "reward": 1.0, "wait_seconds": 20},
        timeout=30,
    ).json()
    assert finished["acknowledged"], finished
    sidecar.stop()
    collector.stop()
    assert (
        found_in(tmp_path / "store.db", *tmp_path.glob("store.db-*"), sidecar.log, collector.log)
        == []
    )
    with store.Store(tmp_path / "store.db") as db:
        calls = [record.call for record in db.records("r2") if record.HasField("call")]
    assert len(calls) == len(CALLS)
    for call in calls:
        headers = dict(call.request_headers)
        assert {name.lower() for name in HEADERS} <= set(headers), "which headers came is kept"
        assert all(headers[name.lower()] == "[redacted]" for name in HEADERS)
        assert headers["content-type"] == "application/json"
        assert b'"api_key":"[redacted]"' in call.request_json
        assert any(
            b'"%s"' % field in call.request_json for field in (b"messages", b"input", b"contents")
        ), "the conversation is kept"
