"""Per-job collector tokens: issued and verified from one master key; every refusal
names the part of the token (or record) at fault."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from openforge.trajectory import auth

KEY = b"k" * 32
OTHER_KEY = b"o" * 32
JOB = auth.JobIdentity("rl", "react-toy", "6f1c2d3e-0000-4000-8000-000000000001")


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_a_token_verifies_to_the_identity_it_was_issued_for() -> None:
    token = auth.issue(KEY, JOB)
    assert token.startswith("ofj1.") and auth.is_job_token(token)
    assert token.split(".")[1] == b64(b"rl/react-toy/6f1c2d3e-0000-4000-8000-000000000001")
    assert auth.verify(KEY, token) == JOB
    assert auth.issue(KEY, JOB) == token, "derived, not random: the operator can make it again"


def test_each_job_gets_its_own_token() -> None:
    tokens = {
        auth.issue(KEY, JOB),
        auth.issue(KEY, auth.JobIdentity("other", JOB.name, JOB.uid)),
        auth.issue(KEY, auth.JobIdentity(JOB.namespace, "react-toy-2", JOB.uid)),
        auth.issue(
            KEY, auth.JobIdentity(JOB.namespace, JOB.name, "6f1c2d3e-0000-4000-8000-000000000002")
        ),
        auth.issue(OTHER_KEY, JOB),
    }
    assert len(tokens) == 5


def test_a_token_of_another_master_key_is_refused() -> None:
    with pytest.raises(auth.TokenError, match="mac does not match"):
        auth.verify(KEY, auth.issue(OTHER_KEY, JOB))


def test_a_token_whose_job_was_swapped_is_refused() -> None:
    """Another job's name under this job's MAC: the MAC covers the job part."""
    version, _, mac = auth.issue(KEY, JOB).split(".")
    forged = f"{version}.{b64(b'rl/other-job/6f1c2d3e-0000-4000-8000-000000000001')}.{mac}"
    with pytest.raises(auth.TokenError, match="mac does not match"):
        auth.verify(KEY, forged)


def test_a_wrong_mac_is_refused() -> None:
    version, job, mac = auth.issue(KEY, JOB).split(".")
    digest = base64.urlsafe_b64decode(mac + "=")
    flipped = b64(bytes([digest[0] ^ 1]) + digest[1:])
    for bad in (flipped, b64(digest[:-1]), "AAAA"):
        with pytest.raises(auth.TokenError, match="mac does not match"):
            auth.verify(KEY, f"{version}.{job}.{bad}")


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("", "has 1 dot-separated parts, not 3"),
        ("s3cret", "has 1 dot-separated parts, not 3"),
        ("ofj1.a.b.c", "has 4 dot-separated parts, not 3"),
        ("ofj2.YQ.YQ", "version 'ofj2' is not 'ofj1'"),
        ("ofj1..YQ", "job part is empty"),
        ("ofj1.YQ.", "mac part is empty"),
        ("ofj1.a+b/.YQ", "job part is not base64url"),
        ("ofj1.YQ.a b", "mac part is not base64url"),
        ("ofj1.Y.YQ", "job part is not base64url"),
        ("ofj1.YQ.é", "mac part is not base64url"),
    ],
)
def test_a_malformed_token_is_refused_naming_the_part(token: str, message: str) -> None:
    with pytest.raises(auth.TokenError, match=message):
        auth.verify(KEY, token)


def test_a_validly_signed_malformed_identity_is_refused() -> None:
    """Only a holder of the master key could make one; still no crash, and a clear error."""
    payload = f"ofj1.{b64(b'just-a-name')}"
    token = f"{payload}.{b64(auth._mac(KEY, payload))}"
    with pytest.raises(auth.TokenError, match="not <namespace>/<name>/<uid>"):
        auth.verify(KEY, token)


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        (("RL", "job", "u"), "namespace 'RL'"),
        (("rl", "", "u"), "name ''"),
        (("rl", "a/b", "u"), "name 'a/b'"),
        (("rl", "job", ""), "uid ''"),
        (("rl", "job", "u/v"), "uid 'u/v'"),
    ],
)
def test_an_identity_is_checked_part_by_part(parts: tuple[str, str, str], message: str) -> None:
    with pytest.raises(auth.TokenError, match=message):
        auth.JobIdentity(*parts)


def test_identities_round_trip_through_text() -> None:
    assert auth.JobIdentity.parse(str(JOB)) == JOB
    assert JOB.describe() == "RolloutJob rl/react-toy (uid 6f1c2d3e-0000-4000-8000-000000000001)"
    with pytest.raises(auth.TokenError, match="not <namespace>/<name>/<uid>"):
        auth.JobIdentity.parse("rl/react-toy")


def test_master_keys_are_read_stripped_and_must_be_long_enough(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_bytes(b"x" * 40 + b"\n")
    assert auth.read_master_key(path) == b"x" * 40
    path.write_text("short\n")
    with pytest.raises(ValueError, match="the master key has 5 bytes; at least 32"):
        auth.read_master_key(path)
    with pytest.raises(ValueError, match="missing"):
        auth.read_master_key(tmp_path / "missing")


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        (("react-toy", "react-toy-3-0", "react-toy-3-0/call/1"), None),
        (
            ("other", "other-3-0", "other-3-0/call/1"),
            "job 'other' is not this stream's job: its token is for RolloutJob rl/react-toy",
        ),
        (
            ("react-toy", "other-3-0", "other-3-0/call/1"),
            "rollout_id 'other-3-0' is not a rollout of job 'react-toy'",
        ),
        (
            ("react-toy", "react-toy-3", "react-toy-3/started"),
            "rollout_id 'react-toy-3' is not a rollout",
        ),
        (
            ("react-toy", "react-toy-3-0", "other-3-0/started"),
            "idempotency_key 'other-3-0/started' does not start with its rollout_id",
        ),
        (
            ("react-toy", "react-toy-3-0", "react-toy-3-0x/started"),
            "does not start with its rollout_id",
        ),
    ],
)
def test_a_token_writes_its_own_jobs_records_only(
    record: tuple[str, str, str], problem: str | None
) -> None:
    job, rollout_id, key = record
    found = auth.record_problem(JOB, job=job, rollout_id=rollout_id, idempotency_key=key)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
