"""One attempt's processes: the sidecar's command line, as the sidecar itself parses it."""

from __future__ import annotations

from pathlib import Path

from openforge_runner import executor, plan
from openforge_sidecar import cli as sidecar_cli

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
