"""``openforge collector`` and ``openforge trajectories``.

The front door (``openforge.cli``) calls these with the arguments that
follow the subcommand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from openforge.trajectory import auth
from rich.console import Console

from openforge_trainer.collection import collector
from openforge_trainer.collection import store as store_module
from openforge_trainer.trajectories import export, outcome, render

# -- openforge collector -------------------------------------------------------


def collector_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="openforge collector",
        description="Receive trajectory records from sidecars and store them durably.",
    )
    parser.add_argument("--store", required=True, type=Path, help="SQLite store file")
    parser.add_argument(
        "--listen", default="127.0.0.1:50051", help="HOST:PORT to bind (default %(default)s)"
    )
    parser.add_argument(
        "--token-file", type=Path, help="file holding a shared bearer token (may write any record)"
    )
    parser.add_argument(
        "--master-key-file",
        type=Path,
        help="file holding the master key of per-job tokens (the operator's"
        " --collector-master-key-file): each such token may write its own job's records only",
    )
    parser.add_argument(
        "--grace", type=float, default=5.0, help="seconds in-flight streams get on shutdown"
    )
    args = parser.parse_args(list(argv))
    token = None
    if args.token_file is not None:
        try:
            token = args.token_file.read_text().strip()
        except OSError as exc:
            parser.error(f"--token-file: {exc}")
        if not token:
            parser.error(f"--token-file: {args.token_file} is empty")
    master_key = None
    if args.master_key_file is not None:
        try:
            master_key = auth.read_master_key(args.master_key_file)
        except ValueError as exc:
            parser.error(f"--master-key-file: {exc}")
    try:
        return asyncio.run(
            _run_collector(
                args.store, args.listen, token=token, master_key=master_key, grace=args.grace
            )
        )
    except OSError as exc:
        print(f"openforge collector: {exc}", file=sys.stderr)
        return 1


async def _run_collector(
    store: Path, listen: str, *, token: str | None, master_key: bytes | None, grace: float
) -> int:
    running, port = await collector.serve(store, listen=listen, token=token, master_key=master_key)
    host = listen.rsplit(":", 1)[0]
    tokens = [kind for kind, on in (("shared", token), ("per-job", master_key)) if on]
    access = f"{' and '.join(tokens)} bearer tokens" if tokens else "no authentication"
    print(f"openforge collector: listening on {host}:{port} (store {store}, {access})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    print("openforge collector: stopping", flush=True)
    await running.stop(grace)
    return 0


# -- openforge trajectories ----------------------------------------------------


def trajectories_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="openforge trajectories", description="Inspect and export captured trajectories."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    ls = commands.add_parser("ls", help="list rollouts")
    ls.add_argument("--store", required=True, type=Path)
    ls.add_argument("--job", help="only this job (default: every job)")
    ls.add_argument("--json", action="store_true", help="print the rollouts as one JSON array")
    show = commands.add_parser(
        "show", help="show one rollout turn by turn, with token counts and the training mask"
    )
    show.add_argument("rollout")
    show.add_argument("--store", required=True, type=Path)
    show.add_argument("--json", action="store_true", help="print the view as one JSON object")
    show.add_argument("--full", action="store_true", help="do not shorten long texts")
    show.add_argument(
        "--tokenizer",
        type=Path,
        help="tokenizer.json, or a model directory holding one, to decode masked/trained spans"
        " (default: the newest checkpoint's beside the store, if any)",
    )
    show.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="rich output: auto = when stdout is a terminal",
    )
    out = commands.add_parser(
        "export", help="write training rows of a job's complete rollouts (their completed calls)"
    )
    out.add_argument("--store", required=True, type=Path)
    out.add_argument("--job", required=True)
    out.add_argument("--format", required=True, choices=sorted(export.WRITERS))
    out.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(list(argv))
    if not args.store.is_file():
        print(f"openforge trajectories: --store: no store at {args.store}", file=sys.stderr)
        return 2
    with store_module.Store(args.store) as store:
        if args.command == "ls":
            return _ls(store, args.job, as_json=args.json)
        if args.command == "show":
            return _show(store, args)
        return _export(store, args.job, format=args.format, out=args.out)


def _ls(store: store_module.Store, job: str | None, *, as_json: bool = False) -> int:
    rows = ls_rows(store, job)
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    header = ("rollout", "task", "sample", "status", "reward", "calls", "failed", "segments")
    table: list[tuple[str, ...]] = [header]
    for row in rows:
        calls = (
            f"{row['calls']}/{row['calls_expected']}"
            if row["calls_expected"] is not None
            else str(row["calls"])
        )
        reward = f"{row['reward']:g}" if row["reward"] is not None else "-"
        failed = str(sum(row["failed_calls"].values()))
        table.append(
            (
                row["rollout"],
                row["task"],
                str(row["sample"]),
                row["status"],
                reward,
                calls,
                failed,
                str(row["segments"]),
            )
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
    print(totals(rows))
    return 0


def ls_rows(store: store_module.Store, job: str | None) -> list[dict[str, Any]]:
    """One dict a rollout of ``job`` (every job without one), as ``ls`` lists them.

    ``failed_calls`` counts the calls that are never trained, by kind
    (:mod:`outcome`); ``segments`` the rows its completed calls make.
    """
    rows: list[dict[str, Any]] = []
    for name in [job] if job else store.jobs():
        for rollout in store.rollouts(name):
            found, stats = export.segments(store.calls(rollout.rollout_id))
            rows.append({
                "job": name,
                "rollout": rollout.rollout_id,
                "task": rollout.task_id,
                "sample": rollout.sample_index,
                "attempt": rollout.attempt,
                "status": _status(rollout),
                "reward": rollout.reward if rollout.has_reward else None,
                "calls": rollout.calls_stored,
                "calls_expected": rollout.call_count_expected if rollout.finished else None,
                "failed_calls": stats.failures(),
                "segments": len(found),
            })  # fmt: skip
    return rows


def totals(rows: list[dict[str, Any]]) -> str:
    """The line under ``ls``'s table: rollouts by status, calls (the failed by kind), the
    mean reward (pure)."""
    if not rows:
        return "no rollouts"
    by_status = Counter(str(row["status"]) for row in rows)
    statuses = ", ".join(f"{count} {status}" for status, count in sorted(by_status.items()))
    rewards = [float(row["reward"]) for row in rows if row["reward"] is not None]
    mean = f", mean reward {sum(rewards) / len(rewards):.3g} over {len(rewards)}" if rewards else ""
    calls = sum(int(row["calls"]) for row in rows)
    failures: Counter[str] = Counter()
    for row in rows:
        failures.update(row["failed_calls"])
    failed = sum(failures.values())
    never = f" ({failed} failed, never trained: {outcome.describe(failures)})" if failed else ""
    return (
        f"{len(rows)} rollout{'s' * (len(rows) != 1)} ({statuses}), {calls} "
        f"call{'s' * (calls != 1)}{never}{mean}"
    )


def _status(rollout: store_module.Rollout) -> str:
    if not rollout.finished:
        return "running"
    if not rollout.complete:
        return f"{rollout.status or 'finished'} (incomplete)"
    return rollout.status or "finished"


def _show(store: store_module.Store, args: argparse.Namespace) -> int:
    tokenizer_path = args.tokenizer or render.find_tokenizer(args.store)
    tokenizer = None
    if tokenizer_path is not None:
        try:
            tokenizer = render.load_tokenizer(tokenizer_path)
        except Exception as exc:  # tokenizers raises its own untyped errors
            print(
                f"openforge trajectories: --tokenizer: cannot load {tokenizer_path}: {exc}",
                file=sys.stderr,
            )
            return 2
    view = render.build(store, args.rollout, tokenizer=tokenizer)
    if view is None:
        print(f"openforge trajectories: no rollout {args.rollout!r}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(render.to_json(view), ensure_ascii=False))
    elif args.color == "always" or (args.color == "auto" and sys.stdout.isatty()):
        render.render_rich(view, Console(force_terminal=True), full=args.full)
    else:
        render.render_plain(view, sys.stdout, full=args.full)
    return 0


def _export(store: store_module.Store, job: str, *, format: str, out: Path) -> int:
    try:
        rows, stats = export.job_rows(store, job)
    except export.ExportError as exc:
        print(f"openforge trajectories export: {exc}", file=sys.stderr)
        return 1
    count = export.WRITERS[format](rows, out)
    failed = ", ".join(f"{number} {kind}" for kind, number in stats.failures().items())
    print(
        f"wrote {count} rows from {stats.rollouts} complete rollouts to {out}"
        f" ({stats.conversations} conversations, merge rate {stats.merge_rate:.1%} within them,"
        f" split on token mismatch {stats.split_on_mismatch},"
        f" untokenized calls {stats.untokenized}, failed calls not trained: {failed})"
    )
    return 0
