"""``openforge analyze``: behaviour metrics of stored trajectories.

Reads the collector's store, decodes each finished rollout into an episode
(:mod:`openforge_trainer.analysis.episodes`), measures it
(:mod:`openforge_trainer.analysis.metrics`) and prints one column per group (harness, policy
version, or both), or a before/after comparison of two policy versions, as a table or as JSON.
``docs/analysis.md`` defines every metric.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openforge import trajectory
from rich.console import Console
from rich.table import Table

from openforge_trainer.analysis import episodes
from openforge_trainer.analysis import metrics as analysis
from openforge_trainer.collection import store as store_module

PROG = "openforge analyze"


class UsageError(Exception):
    """A bad argument (names the flag)."""


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(
        prog=PROG,
        description="Behaviour metrics (self-verification, tool coverage, error recovery, "
        "plan completion) of stored trajectories, per harness and policy version. "
        "Definitions: docs/analysis.md.",
    )
    cli.add_argument("--store", required=True, type=Path, help="the collector's SQLite store")
    cli.add_argument(
        "--job", action="append", help="only this job (repeatable; default: every job)"
    )
    cli.add_argument(
        "--by",
        choices=analysis.GROUPINGS,
        default="both",
        help="group episodes by harness, policy version, or both (default %(default)s)",
    )
    cli.add_argument(
        "--success-threshold",
        type=float,
        default=0.0,
        help="an episode succeeds when its reward is strictly above this (default %(default)g)",
    )
    cli.add_argument(
        "--compare",
        nargs="*",
        type=int,
        metavar="VERSION",
        help="before/after per harness: two policy versions BEFORE AFTER, "
        "or none for the lowest and highest present",
    )
    cli.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return cli


@dataclass(frozen=True)
class Loaded:
    measured: list[analysis.EpisodeMetrics]
    jobs: list[str]
    unfinished: int


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    try:
        loaded = _load(args.store, args.job, threshold=args.success_threshold)
        if not loaded.measured:
            print(f"{PROG}: no finished rollouts in {args.store}", file=sys.stderr)
            return 1
        comparison = None
        if args.compare is not None:
            comparison = compare(loaded.measured, versions(loaded.measured, args.compare))
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    groups = analysis.grouped(loaded.measured, args.by)
    _warn_problems(loaded.measured)
    if args.json:
        document = report(args, loaded, groups=groups, comparison=comparison)
        print(json.dumps(document, indent=2, sort_keys=False))
        return 0
    console = Console(highlight=False, soft_wrap=True)
    print(_headline(args, loaded))
    _print_table(console, group_table(groups))
    for item in comparison or []:
        print(f"\n{item.harness or '(unnamed)'}: policy v{item.before} -> v{item.after}")
        _print_table(console, comparison_table(item))
    return 0


# -- loading -------------------------------------------------------------------------------


def _load(path: Path, jobs: list[str] | None, *, threshold: float) -> Loaded:
    if not path.is_file():
        raise UsageError(f"--store: no store at {path}")
    measured: list[analysis.EpisodeMetrics] = []
    unfinished = 0
    with store_module.Store(path) as store:
        present = store.jobs()
        for job in jobs or []:
            if job not in present:
                raise UsageError(f"--job: no job {job!r} in {path} (jobs: {', '.join(present)})")
        chosen = jobs or present
        for job in chosen:
            for rollout in store.rollouts(job):
                if not rollout.finished or rollout.status == trajectory.STOPPED:
                    unfinished += 1  # a stopped attempt was cut off: not an episode
                    continue
                episode = episodes.episode(rollout, store.calls(rollout.rollout_id))
                measured.append(analysis.measure(episode, success_threshold=threshold))
    return Loaded(measured, list(chosen), unfinished)


def versions(measured: Sequence[analysis.EpisodeMetrics], given: Sequence[int]) -> tuple[int, int]:
    """The BEFORE and AFTER policy versions of ``--compare`` (both must have episodes)."""
    present = sorted({item.episode.policy_version for item in measured})
    listed = ", ".join(str(v) for v in present)
    if not given:
        if len(present) < 2:
            raise UsageError(f"--compare: needs two policy versions, the store has {listed}")
        return present[0], present[-1]
    if len(given) != 2:
        raise UsageError(
            f"--compare: give two policy versions BEFORE AFTER or none, not {len(given)}"
        )
    for version in given:
        if version not in present:
            raise UsageError(
                f"--compare: no finished rollouts at policy version {version} (present: {listed})"
            )
    return given[0], given[1]


@dataclass(frozen=True)
class TableData:
    """A table as the report prints it: a header row, then rows of cells."""

    headers: list[str]
    rows: list[list[str]]


# -- comparing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """One harness's summaries at two policy versions."""

    harness: str
    before: int
    after: int
    old: analysis.Summary
    new: analysis.Summary


def compare(measured: Sequence[analysis.EpisodeMetrics], pair: tuple[int, int]) -> list[Comparison]:
    """One comparison per harness that has episodes at both versions."""
    before, after = pair
    groups = analysis.grouped(measured, "both")
    found = []
    for harness in sorted({key.harness or "" for key in groups}):
        old = groups.get(analysis.GroupKey(harness, before))
        new = groups.get(analysis.GroupKey(harness, after))
        if old is not None and new is not None:
            found.append(Comparison(harness, before, after, old, new))
    if not found:
        raise UsageError(
            f"--compare: no harness has finished rollouts at both v{before} and v{after}"
        )
    return found


def comparison_table(comparison: Comparison) -> TableData:
    old, new = comparison.old, comparison.new
    rows = [["episodes", str(old.episodes), str(new.episodes), ""]]
    for metric in analysis.METRICS:
        change = _change(analysis.delta(metric.ratio(old), metric.ratio(new)), metric.percent)
        rows.append([metric.label, _cell(metric, old), _cell(metric, new), change])
    rows.append(["tools used", _tools(old), _tools(new), ""])
    return TableData(["metric", f"v{comparison.before}", f"v{comparison.after}", "change"], rows)


def _change(value: float | None, percent: bool) -> str:
    if value is None:
        return "n/a"
    return f"{value * 100:+.1f} pt" if percent else f"{value:+.3g}"


def comparison_json(comparison: Comparison) -> dict[str, Any]:
    metrics = {}
    for metric in analysis.METRICS:
        a, b = metric.ratio(comparison.old), metric.ratio(comparison.new)
        metrics[metric.name] = {"before": a.value, "after": b.value, "delta": analysis.delta(a, b)}
    return {
        "harness": comparison.harness,
        "before": comparison.before,
        "after": comparison.after,
        "episodes": {"before": comparison.old.episodes, "after": comparison.new.episodes},
        "metrics": metrics,
    }


# -- tables ---------------------------------------------------------------------------------


def group_table(groups: dict[analysis.GroupKey, analysis.Summary]) -> TableData:
    """Metrics as rows, one column per group."""
    summaries = list(groups.values())
    rows = [
        ["episodes", *(str(s.episodes) for s in summaries)],
        ["rewarded", *(str(s.rewarded) for s in summaries)],
    ]
    for metric in analysis.METRICS:
        rows.append([metric.label, *(_cell(metric, s) for s in summaries)])
    rows += [
        ["tools used", *(_tools(s) for s in summaries)],
        ["error episodes", *(str(s.error_episodes) for s in summaries)],
        ["plan episodes", *(_plans(s) for s in summaries)],
        ["undecodable", *(str(s.decode_problems) for s in summaries)],
    ]
    return TableData(["metric", *(key.label() for key in groups)], rows)


def _cell(metric: analysis.Metric, summary: analysis.Summary) -> str:
    ratio = metric.ratio(summary)
    value = ratio.value
    if value is None:
        return "n/a"
    if not metric.percent:
        return f"{value:.3g}"
    if metric.mean:
        return f"{value:.1%} (n={ratio.denominator})"
    return f"{value:.1%} ({ratio.numerator:g}/{ratio.denominator})"


def _tools(summary: analysis.Summary) -> str:
    return (
        f"{len(summary.tools_used)}/{len(summary.tools_offered)} {','.join(summary.tools_used)}"
    ).strip()


def _plans(summary: analysis.Summary) -> str:
    if not summary.plan_sources:
        return "0"
    sources = ", ".join(f"{n} {source}" for source, n in sorted(summary.plan_sources.items()))
    return f"{summary.plan_episodes} ({sources})"


def _print_table(console: Console, data: TableData) -> None:
    """A rich table on a terminal, aligned plain text otherwise (pipes, files, tests)."""
    if console.is_terminal:
        table = Table(*data.headers)
        for row in data.rows:
            table.add_row(*row)
        console.print(table)
        return
    print(plain_table(data.headers, data.rows))


def plain_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = [headers, *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def _headline(args: argparse.Namespace, loaded: Loaded) -> str:
    skipped = f"; {loaded.unfinished} unfinished skipped" if loaded.unfinished else ""
    return (
        f"{args.store}: job {', '.join(loaded.jobs)}; {len(loaded.measured)} finished rollouts"
        f"{skipped}; success: reward > {args.success_threshold:g}"
    )


def _warn_problems(measured: Sequence[analysis.EpisodeMetrics]) -> None:
    broken = [item.episode for item in measured if item.episode.problems]
    if broken:
        first = broken[0]
        print(
            f"{PROG}: {len(broken)} episode(s) have calls that did not decode and were measured"
            f" without them; first: rollout {first.rollout_id} {first.problems[0]}",
            file=sys.stderr,
        )


# -- JSON -----------------------------------------------------------------------------------


def _ratio(ratio: analysis.Ratio) -> dict[str, Any]:
    return {"value": ratio.value, "numerator": ratio.numerator, "denominator": ratio.denominator}


def summary_json(summary: analysis.Summary) -> dict[str, Any]:
    document: dict[str, Any] = {
        "episodes": summary.episodes,
        "rewarded": summary.rewarded,
        "undecodable": summary.decode_problems,
    }
    document.update({metric.name: _ratio(metric.ratio(summary)) for metric in analysis.METRICS})
    document.update(
        tools_offered=list(summary.tools_offered),
        tools_used=list(summary.tools_used),
        unknown_tool_calls=summary.unknown_tool_calls,
        error_episodes=summary.error_episodes,
        plan_episodes=summary.plan_episodes,
        plan_sources=dict(summary.plan_sources),
    )
    return document


def report(
    args: argparse.Namespace,
    loaded: Loaded,
    *,
    groups: dict[analysis.GroupKey, analysis.Summary],
    comparison: list[Comparison] | None,
) -> dict[str, Any]:
    document: dict[str, Any] = {
        "store": str(args.store),
        "jobs": loaded.jobs,
        "by": args.by,
        "success_threshold": args.success_threshold,
        "unfinished_skipped": loaded.unfinished,
        "groups": [
            {"harness": key.harness, "policy_version": key.policy_version, **summary_json(s)}
            for key, s in groups.items()
        ],
        "problems": [
            {"rollout_id": item.episode.rollout_id, "problems": list(item.episode.problems)}
            for item in loaded.measured
            if item.episode.problems
        ],
    }
    if comparison is not None:
        document["comparison"] = [comparison_json(c) for c in comparison]
    return document
