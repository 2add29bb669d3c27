"""The ``openforge`` command: one front door, one subcommand per component.

Each subcommand is implemented by a component's own ``cli`` module, imported
only when that subcommand runs; this keeps ``openforge --help`` fast and keeps
components independent of each other.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable, Sequence

# subcommand -> (module, function, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("openforge_runner.cli", "main", "run a RolloutJob (and train on it) on this machine"),
    "sidecar": (
        "openforge_sidecar.cli",
        "main",
        "run the capture sidecar (mitmproxy + capture addon)",
    ),
    "drain": (
        "openforge_sidecar.recording.drain",
        "main",
        "deliver what stopped sidecars left in their spools; "
        "close the rollouts they never finished",
    ),
    "collector": (
        "openforge_trainer.cli",
        "collector_main",
        "run the trajectory collector (gRPC + durable store)",
    ),
    "trajectories": (
        "openforge_trainer.cli",
        "trajectories_main",
        "inspect and export captured trajectories",
    ),
    "test-engine": (
        "openforge_trainer.testengine.engine",
        "main",
        "serve the deterministic token-in/token-out test engine",
    ),
    "tokenizer": (
        "openforge_trainer.tiny.tokenizer_build",
        "main",
        "build the tiny offline tokenizer and chat template",
    ),
    "serve": (
        "openforge_trainer.serving.server",
        "main",
        "serve a Hugging Face causal LM over vLLM's /v1/completions (continuous batching, live "
        "weight updates)",
    ),
    "train": (
        "openforge_trainer.training.cli",
        "main",
        "train the policy on captured rollouts (GRPO) and publish new weights",
    ),
    "train-verl": (
        "openforge_trainer.training.verl_launch",
        "main",
        "train on captured rollouts with veRL's Ray trainer (GRPO, FSDP2 workers) and publish "
        "new weights",
    ),
    "model": (
        "openforge_trainer.tiny.cli",
        "main",
        "build, warm-start and evaluate the tiny offline policy",
    ),
    "crds": ("openforge.api.crds", "main", "write crds/ from the API models"),
    "operator": (
        "openforge_operator.cli",
        "main",
        "run the Kubernetes operator (kopf) for RolloutJob and HarnessEnv",
    ),
    "analyze": (
        "openforge_trainer.analysis.cli",
        "main",
        "behaviour metrics of stored trajectories per harness and policy version",
    ),
}


_ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|obj):`~?([^`]+)`")


def description(doc: str | None) -> str | None:
    """A module docstring's first paragraph as ``--help`` text: its reST markup (double
    backquotes, ``:mod:`` and like roles) written plain, its lines joined (pure)."""
    if not doc:
        return None
    first = doc.strip().split("\n\n", 1)[0]
    plain = _ROLE.sub(r"\1", first).replace("``", "")
    return " ".join(plain.split())


def _usage() -> str:
    lines = ["usage: openforge <command> [options]", "", "commands:"]
    width = max(len(name) for name in COMMANDS)
    for name, (_, _, summary) in COMMANDS.items():
        lines.append(f"  {name.ljust(width)}  {summary}")
    lines.append("")
    lines.append("Run `openforge <command> --help` for a command's options.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"openforge: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, function_name, _ = COMMANDS[name]
    function: Callable[[list[str]], int] = getattr(
        importlib.import_module(module_name), function_name
    )
    try:
        return function(rest)
    except BrokenPipeError:
        # the reader went away (`openforge analyze --json | head`): stop quietly,
        # as a shell tool does; point stdout at /dev/null so the flush at exit
        # does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by it


if __name__ == "__main__":
    sys.exit(main())
