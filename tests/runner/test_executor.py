"""One attempt's processes: the sidecar's command line, as the sidecar itself parses it,
and an attempt whose sidecar never starts."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from openforge_runner import executor, plan, processes
from openforge_sidecar import cli as sidecar_cli
from openforge_trainer.collection import store

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_sidecar_gets_the_tokenizer_only_when_the_engine_does_not_serve_it(
    tmp_path: Path,
) -> None:
    """``openforge serve`` serves its tokenizer's files and a sidecar loads them from it;
    the trainer's own vLLM servers do not, so the sidecar is given the policy's directory."""
    bundle = plan.load([EXAMPLES / "react-toy.yaml"])
    rollout = plan.rollouts_for(bundle, 0)[0]
    served = executor.Endpoints("http://127.0.0.1:8000", "127.0.0.1:50051", 3)
    args = executor.sidecar_args(bundle, rollout, endpoints=served, home=tmp_path, port=9)
    assert args[0] == "sidecar" and "--tokenizer" not in args
    parsed = sidecar_cli.build_parser().parse_args(args[1:])
    assert (parsed.engine, parsed.tokenizer, parsed.policy_version) == (served.engine, "", 3)
    own = executor.Endpoints("http://10.0.0.5:41234", "127.0.0.1:50051", 2, tokenizer="/m")
    args = executor.sidecar_args(bundle, rollout, endpoints=own, home=tmp_path, port=9)
    parsed = sidecar_cli.build_parser().parse_args(args[1:])
    assert (parsed.engine, parsed.tokenizer, parsed.policy_version) == (own.engine, "/m", 2)
    assert (parsed.listen, parsed.spool) == ("127.0.0.1:9", tmp_path / "spool")


@pytest.mark.parametrize(("tried_again", "status"), [(False, "failed"), (True, "stopped")])
def test_an_attempt_whose_sidecar_never_starts_is_recorded_closed(
    tmp_path: Path, procs: Any, monkeypatch: pytest.MonkeyPatch, tried_again: bool, status: str
) -> None:
    """Nothing of it reached the store before: a trainer waiting for the sample's newest
    attempt (an earlier attempt's finish said it would be tried again) waited for ever.
    Now it is there, started and closed: ``failed`` when the sample is given up (done),
    ``stopped`` when it is tried again (waited for)."""

    def never(self: processes.Service, timeout: float) -> None:
        raise processes.ServiceError("sidecar: did not listen within 60 s")

    monkeypatch.setattr(processes.Service, "start", never)
    collector = procs.collector(tmp_path / "store.db")
    bundle = plan.load([EXAMPLES / "react-toy.yaml"])
    rollout = plan.rollouts_for(bundle, 0)[0].retry()
    outcome = executor.run_rollout(
        bundle, rollout, run_dir=tmp_path / "run", stop=threading.Event(),
        endpoints=executor.Endpoints("http://127.0.0.1:9", f"127.0.0.1:{collector.port}", 4),
        tried_again=lambda tried: tried_again,
    )  # fmt: skip
    assert (outcome.status, outcome.reason, outcome.retried) == ("failed", "SidecarFailed", False)
    assert "did not listen within 60 s; drained its spool: 3 records delivered" in outcome.message
    with store.Store(tmp_path / "store.db") as db:
        recorded = db.rollout(rollout.rollout_id)
    assert recorded is not None and recorded.complete
    assert (recorded.attempt, recorded.policy_version, recorded.status) == (1, 4, status)
    assert recorded.batch == plan.batch_label(bundle, 0)
