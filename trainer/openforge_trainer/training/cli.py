"""``openforge train``: wait for complete task groups, train a step, checkpoint, publish, repeat.

SIGTERM and SIGINT stop the loop cleanly after the current step (its
checkpoint, store marks and publish complete first); a stop while waiting for
groups does not train the groups found so far (a partial step). A second signal aborts
at once: an unfinished step is lost, and its groups are trained after a restart.
SIGUSR1 prints every thread's Python stack to stderr and goes on (where a trainer
that does not stop is waiting).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import re
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from openforge_trainer.training import config as train_config

# CLI flag -> TrainConfig field, for the flags whose names differ
_RENAMED = {"serve": "serve_urls", "vllm": "vllm_urls"}


def parser() -> argparse.ArgumentParser:
    fields = train_config.TrainConfig.model_fields
    cli = argparse.ArgumentParser(
        prog="openforge train",
        description="Train the policy with GRPO on a job's captured rollouts and publish "
        "each new checkpoint to the inference servers.",
    )

    def add(flag: str, *, field: str | None = None, **kwargs: Any) -> None:
        name = field or flag.lstrip("-").replace("-", "_")
        help_text = fields[name].description or ""
        default = fields[name].default
        if kwargs.get("action") is None and default not in (None, ()):
            help_text += f" (default {default})"
        cli.add_argument(flag, dest=name, help=help_text, **kwargs)

    add("--store", type=Path, required=True)
    add("--job", required=True)
    add("--model", type=Path, required=True)
    add("--run-dir", type=Path, required=True)
    add("--serve", field="serve_urls", action="append", metavar="URL")
    add("--serve-publish", choices=("path", "bytes"))
    add("--vllm", field="vllm_urls", action="append", metavar="URL")
    add("--steps", type=int)
    add("--groups-per-step", type=int)
    add("--group-size", type=int)
    add("--wait-for-groups", type=float, metavar="SECONDS")
    add("--poll-interval", type=float, metavar="SECONDS")
    add("--lr", type=float)
    add("--seed", type=int)
    add("--max-staleness", type=int)
    add("--micro-batch-tokens", type=int)
    add("--max-grad-norm", type=float)
    add("--kl-coef", type=float)
    add("--entropy-coeff", type=float)
    add("--clip-ratio-low", type=float)
    add("--clip-ratio-high", type=float)
    add("--adv-estimator")
    add("--pass-threshold", type=float)
    add("--keep-checkpoints", type=int)
    add("--device")
    add("--dtype")
    cli.add_argument(
        "--option",
        dest="options",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="Any other setting by its field name (snake_case or camelCase), the value as JSON "
        "or else as a string, e.g. --option adam_eps=1e-5 (a RolloutJob's spec.training.options).",
    )
    cli.add_argument(
        "--check",
        action="store_true",
        help="Validate the settings, print them as JSON and exit (nothing is read or trained).",
    )
    return cli


def _field_name(name: str) -> str:
    """``adamEps`` -> ``adam_eps``; snake_case names are kept."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def apply_options(values: dict[str, Any], options: Sequence[str]) -> dict[str, Any]:
    """``values`` plus each ``NAME=VALUE`` option; ConfigError names a malformed or doubled one."""
    merged = dict(values)
    flags = {
        action.dest: action.option_strings[0]
        for action in parser()._actions
        if action.option_strings
    }
    for option in options:
        name, sep, raw = option.partition("=")
        if not sep or not name.strip():
            raise train_config.ConfigError(f"--option {option!r}: expected NAME=VALUE")
        field = _field_name(name.strip())
        if field in merged:
            where = flags.get(field, f"--option {field}")
            raise train_config.ConfigError(
                f"--option {option!r}: {field} is already set (by {where})"
            )
        try:
            merged[field] = json.loads(raw)
        except ValueError:
            merged[field] = raw
    return merged


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    values = {
        key: value
        for key, value in vars(args).items()
        if value is not None and key not in ("options", "check")
    }
    try:
        config = train_config.load(**apply_options(values, args.options))
    except train_config.ConfigError as exc:
        print(f"openforge train: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(config.model_dump_json(indent=2))
        return 0
    if not config.store.is_file():
        print(f"openforge train: --store: no store at {config.store}", file=sys.stderr)
        return 2
    import torch

    from openforge_trainer.training import (
        loop as trainer_loop,  # torch, transformers, verl: only when training
    )

    stop = threading.Event()
    _on_signals(stop)
    trainer = trainer_loop.Trainer.open(config, log=lambda line: print(line, flush=True))
    try:
        where = f"resumed at step {trainer.state.step}" if trainer.state.step else "starting"
        print(
            f"openforge train: {where} (policy v{trainer.state.policy_version}), "
            f"job {config.job}, run dir {config.run_dir}, "
            f"torch threads {torch.get_num_threads()}",
            flush=True,
        )
        trained = trainer.run(stop)
    finally:
        trainer.close()
    print(
        f"openforge train: stopped after {trained} step(s) this run "
        f"(step {trainer.state.step}, policy v{trainer.state.policy_version})",
        flush=True,
    )
    return 0


def _on_signals(stop: threading.Event) -> None:
    def handle(signum: int, frame: FrameType | None) -> None:
        del frame
        if stop.is_set():
            raise KeyboardInterrupt
        print(
            f"openforge train: {signal.Signals(signum).name}: stopping after the current step",
            flush=True,
        )
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handle)
    faulthandler.register(signal.SIGUSR1, all_threads=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
