"""`openforge run` end to end: real processes, real sidecars, the real ReAct harness.

These runs capture only (`--no-train`) against the deterministic test
engine, so they check the runner's part: every rollout runs in its own
directory with its own sidecar, is graded, reaches the store complete, and a
run stopped midway continues on rerun with no rollout counted twice.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import learning_runs
import pytest
from openforge_trainer.collection import store

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def manifest(
    tmp_path: Path, engine_url: str, *, tasks: int, samples: int, parallelism: int = 2
) -> Path:
    """The react-toy example, pointed at the test engine, on a few tasks."""
    lines = (EXAMPLES / "tasks" / "toy-tools" / "demo.jsonl").read_text().splitlines()[:tasks]
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text("\n".join(lines) + "\n")
    text = (EXAMPLES / "react-toy.yaml").read_text()
    text = text.replace("$OPENFORGE_MANIFEST_DIR", str(EXAMPLES)).replace(
        "${OPENFORGE_MANIFEST_DIR}", str(EXAMPLES)
    )
    text = text.replace("file: tasks/toy-tools/demo.jsonl", f"file: {task_file}")
    text = text.replace(
        "    model: models/tiny-react", f"    model: openforge-tiny\n    endpoint: {engine_url}"
    )
    text = text.replace("samplesPerTask: 4", f"samplesPerTask: {samples}").replace(
        "parallelism: 4", f"parallelism: {parallelism}"
    )
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "openforge.cli", "run", *args],
        capture_output=True,
        text=True,
        timeout=600,
        **kwargs,
    )


def journal(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "journal.jsonl").read_text().splitlines()]


def wait_for_finishes(run_dir: Path, count: int, timeout: float = 120) -> None:
    """Until the run's journal has ``count`` finished rollouts."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "journal.jsonl").exists() and sum(
            e["event"] == "finish" for e in journal(run_dir)
        ) >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"fewer than {count} rollouts finished within {timeout:g} s")


def test_a_local_run_captures_and_grades_every_rollout(procs: Any, tmp_path: Path) -> None:
    engine = procs.engine()
    run_dir = tmp_path / "run"
    done = run(
        [
            str(manifest(tmp_path, engine.url, tasks=2, samples=2)),
            "--no-train",
            "--quiet",
            "--run-dir",
            str(run_dir),
            "--iterations",
            "1",
        ]
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "iteration 1/1: 4/4 done, 0 failed, mean reward 1.0" in done.stdout
    finished = [e for e in journal(run_dir) if e["event"] == "finish"]
    assert sorted(e["rollout_id"] for e in finished) == [f"react-toy-i0-{i}-0" for i in range(4)]
    assert all(
        e["status"] == "succeeded" and e["reward"] == 1.0 and e["calls"] == 2 for e in finished
    )
    with store.Store(run_dir / "store.db") as db:
        rollouts = db.rollouts("react-toy")
        assert sorted(r.rollout_id for r in rollouts) == sorted(e["rollout_id"] for e in finished)
        assert all(r.complete and r.reward == 1.0 for r in rollouts)
        assert sorted(len(db.calls(r.rollout_id)) for r in rollouts) == [2, 2, 2, 2]
    # each rollout had its own working directory, holding only the harness's files
    work = run_dir / "rollouts" / "react-toy-i0-0-0" / "work"
    assert sorted(p.name for p in work.iterdir()) == ["answer.txt", "colors.json"]
    # and what its sidecar counted is kept beside it
    counted = json.loads((run_dir / "rollouts" / "react-toy-i0-0-0" / "sidecar.json").read_text())
    assert counted["acknowledged"] and counted["calls"] == 2 and counted["merge_rate"] == 1.0, (
        counted
    )


def test_a_stopped_run_continues_on_rerun_without_counting_a_rollout_twice(
    procs: Any, tmp_path: Path
) -> None:
    engine = procs.engine("--token-delay-ms", "30")
    run_dir = tmp_path / "run"
    path = manifest(tmp_path, engine.url, tasks=3, samples=2, parallelism=2)
    args = [str(path), "--no-train", "--quiet", "--run-dir", str(run_dir), "--iterations", "2"]
    process = subprocess.Popen(
        [sys.executable, "-m", "openforge.cli", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_for_finishes(run_dir, 2)  # stop it once some rollouts finished, mid-iteration
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output
    assert "run the same command again to continue" in output
    before = [e for e in journal(run_dir) if e["event"] == "finish"]
    assert 2 <= len(before) < 12

    again = run(args)
    assert again.returncode == 0, again.stdout + again.stderr
    finished = [e for e in journal(run_dir) if e["event"] == "finish"]
    keys = [(e["iteration"], e["index"]) for e in finished]
    assert sorted(keys) == sorted({(i, n) for i in range(2) for n in range(6)}), (
        "every rollout finished exactly once"
    )
    assert finished[: len(before)] == before  # nothing that finished was redone
    with store.Store(run_dir / "store.db") as db:
        complete = [r for r in db.rollouts("react-toy") if r.complete and r.status != "stopped"]
        # the attempts the stop cut off are closed in the store, as stopped: none is left running
        cut_off = [r for r in db.rollouts("react-toy") if r.status == "stopped"]
        assert all(r.complete and not r.has_reward for r in cut_off)
        assert all(r.finished for r in db.rollouts("react-toy"))
    assert sorted(r.rollout_id for r in complete) == sorted(e["rollout_id"] for e in finished)
    assert "already complete" not in again.stdout
    # once more: nothing is left, and the summary says so
    logs = {path.name: path.stat().st_size for path in run_dir.glob("*.log")}
    third = run(args)
    assert (
        third.returncode == 0
        and "already complete: every rollout had finished in an earlier run" in third.stdout
    ), third.stdout
    assert (
        "        2         6       0        1.000" in third.stdout
    )  # the counts, from the journal
    assert {path.name: path.stat().st_size for path in run_dir.glob("*.log")} == logs, (
        "a process was started"
    )
    assert len([e for e in journal(run_dir) if e["event"] == "finish"]) == len(finished)


def test_a_bad_manifest_fails_before_anything_starts(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    text = (
        (EXAMPLES / "react-toy.yaml")
        .read_text()
        .replace("samplesPerTask: 4", "samplesPerTask: four")
    )
    path.write_text(text)
    done = run([str(path), "--run-dir", str(tmp_path / "run")], env={**os.environ})
    assert done.returncode == 2
    line = next(
        n for n, text_line in enumerate(text.splitlines(), 1) if "samplesPerTask" in text_line
    )
    assert (
        f"job.yaml:{line}: spec.samplesPerTask: input should be a valid integer, got 'four'"
        in done.stderr
    )
    assert not (tmp_path / "run").exists()


def test_bad_trainer_options_stop_the_run_before_any_rollout(tmp_path: Path) -> None:
    """spec.training.options reach `openforge train --check`, which names a bad one before anything
    starts."""
    text = (EXAMPLES / "react-toy.yaml").read_text()
    text = text.replace(
        "    model: models/tiny-react", f"    model: {EXAMPLES / 'models' / 'tiny-react'}"
    )
    text = text.replace(
        "file: tasks/toy-tools/demo.jsonl",
        f"file: {EXAMPLES / 'tasks' / 'toy-tools' / 'demo.jsonl'}",
    )
    assert text.count("    options:\n") == 1  # the demo's own (updateBacktracks)
    text = text.replace(
        "    options:\n", "    options:\n      adamEps: 1.0e-5\n      maxGradNorm: -1\n"
    )
    path = tmp_path / "job.yaml"
    path.write_text(text)
    done = run([str(path), "--run-dir", str(tmp_path / "run"), "--quiet"], env={**os.environ})
    assert done.returncode == 2, done.stderr
    assert (
        "openforge run: RolloutJob react-toy: spec.training: invalid trainer settings"
        in done.stderr
    )
    assert "max_grad_norm: Input should be greater than 0 (got -1)" in done.stderr
    assert "adam_eps" not in done.stderr  # the valid option passed
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()  # checked before anything started or was written


def test_training_with_a_policy_endpoint_is_refused_before_anything_starts(tmp_path: Path) -> None:
    path = manifest(tmp_path, "http://127.0.0.1:9", tasks=1, samples=2)
    done = run([str(path), "--run-dir", str(tmp_path / "run")], env={**os.environ})
    assert done.returncode == 2
    assert "spec.policy.endpoint: training locally needs the policy's weights" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()


def test_a_sidecar_killed_mid_rollout_is_drained_and_its_attempt_closed(
    procs: Any, tmp_path: Path
) -> None:
    """The harness makes its calls, then SIGKILLs its own sidecar before the runner reports
    the rollout, in both of its attempts: the runner says the sidecar died (not that the
    collector did not acknowledge), its spool is delivered, and the attempt is closed in
    the store: ``stopped`` when it is tried again (a trainer waits for the next attempt),
    ``failed`` when the failure policy gives the rollout up (its sample is done)."""
    engine = procs.engine()
    path = manifest(tmp_path, engine.url, tasks=1, samples=1)
    text = path.read_text()
    assert "maxAttemptsPerRollout: 2" in text and "&& exec python" in text
    # react-toy's agent line, the file's first (prepare.py's line goes on; codex-toy's comes later)
    agent = '--task-id "$OPENFORGE_TASK_ID" --workdir .\n'
    text = text.replace("&& exec python", "&& python", 1).replace(
        agent, agent.rstrip("\n") + ' ; pkill -9 -f "[-]-rollout-id $OPENFORGE_ROLLOUT_ID "\n', 1
    )
    path.write_text(text)
    run_dir = tmp_path / "run"
    done = run([str(path), "--no-train", "--quiet", "--run-dir", str(run_dir), "--iterations", "1"])
    assert done.returncode == 0, done.stdout + done.stderr
    [retry] = [e for e in journal(run_dir) if e["event"] == "retry"]
    [finish] = [e for e in journal(run_dir) if e["event"] == "finish"]
    for entry in (retry, finish):
        assert (entry["status"], entry["reason"]) == ("failed", "SidecarFailed"), entry
        assert "its sidecar exited with -9 before the rollout was finished" in entry["message"]
        # what the exporter had not delivered yet, at least the loss report and the finish
        delivered = re.search(
            r"drained its spool: (\d+) records delivered, the attempt recorded lost and failed$",
            entry["message"],
        )
        assert delivered is not None and int(delivered[1]) >= 2, entry
    with store.Store(run_dir / "store.db") as db:
        closed = {r.rollout_id: r for r in db.rollouts("react-toy")}
        assert sorted(closed) == ["react-toy-i0-0-0", "react-toy-i0-0-1"]
        assert closed["react-toy-i0-0-0"].status == "stopped"  # tried again
        assert closed["react-toy-i0-0-1"].status == "failed"  # given up: the sample is done
        assert all(r.complete and not r.has_reward for r in closed.values())
        for rollout_id in closed:
            assert len(db.calls(rollout_id)) == 2  # both calls, once each
        losses = db.lost("react-toy")
        assert len(losses) == 2 and all(lost.whole_rollout for lost in losses)
        assert all(lost.reason.startswith("its sidecar exited with -9") for lost in losses)


def test_a_failed_attempt_tried_again_is_stored_as_tried_again(procs: Any, tmp_path: Path) -> None:
    """The grader fails the first attempt (no reward), and the failure policy tries it
    again: its finish reaches the store saying so, before the retry starts, so a trainer
    waits for the retry instead of deciding the group without it. The retry succeeds;
    its own finish is not tried again."""
    engine = procs.engine()
    path = manifest(tmp_path, engine.url, tasks=1, samples=1)
    grader = f"      - python\n      - {EXAMPLES}/tasks/toy-tools/grade.py\n"
    text = path.read_text()
    assert grader in text
    path.write_text(text.replace(grader, (
        "      - bash\n      - -c\n"
        """      - '[ "$OPENFORGE_ATTEMPT" != 0 ] && exec python "$0" "$@"'\n"""
        f"      - {EXAMPLES}/tasks/toy-tools/grade.py\n"
    ), 1))  # fmt: skip
    run_dir = tmp_path / "run"
    done = run([str(path), "--no-train", "--quiet", "--run-dir", str(run_dir), "--iterations", "1"])
    assert done.returncode == 0, done.stdout + done.stderr
    [retry] = [e for e in journal(run_dir) if e["event"] == "retry"]
    assert (retry["status"], retry["reason"]) == ("failed", "GraderFailed"), retry
    with store.Store(run_dir / "store.db") as db:
        tried = {r.rollout_id: r for r in db.rollouts("react-toy")}
    first, second = tried["react-toy-i0-0-0"], tried["react-toy-i0-0-1"]
    assert (first.status, first.has_reward, first.retried) == ("failed", False, True)
    assert (second.status, second.reward, second.retried) == ("succeeded", 1.0, False)


def test_a_killed_run_s_unfinished_attempt_is_closed_when_the_run_starts_again(
    procs: Any, tmp_path: Path
) -> None:
    """A run killed outright leaves an attempt's spool with no finish (its sidecar was
    killed too): the next start delivers it and records the attempt lost and failed."""
    from openforge_sidecar.recording import records as sidecar_records
    from openforge_sidecar.recording import spool as sidecar_spool

    engine = procs.engine()
    run_dir = tmp_path / "run"
    abandoned = "react-toy-i0-0-0"
    with sidecar_spool.Spool(run_dir / "rollouts" / abandoned / "spool") as left:
        left.append([sidecar_records.started(
            job="react-toy", rollout_id=abandoned, task_id="t", sample_index=0, attempt=0,
            harness="react-toy", policy_version=0, labels={},
        )])  # fmt: skip
    (run_dir / "journal.jsonl").write_text(
        json.dumps(
            {"event": "start", "iteration": 0, "index": 0, "attempt": 0, "rollout_id": abandoned}
        )
        + "\n"
    )
    done = run(
        [
            str(manifest(tmp_path, engine.url, tasks=1, samples=1)),
            "--no-train",
            "--quiet",
            "--run-dir",
            str(run_dir),
            "--iterations",
            "1",
        ]
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "spools left by an earlier run: 3 records delivered, 1 unfinished attempts recorded "
        "lost and failed"
    ) in done.stderr
    with store.Store(run_dir / "store.db") as db:
        old = db.rollout(abandoned)
        assert old is not None and old.finished and old.status == "stopped"
        [lost] = db.lost("react-toy")
        assert (lost.rollout_id, lost.whole_rollout, lost.reason) == (
            abandoned,
            True,
            "the run stopped before this attempt was finished",
        )
        retried = db.rollout("react-toy-i0-0-1")  # the attempt the rerun made instead
        assert retried is not None and retried.status == "succeeded"
    assert [e["rollout_id"] for e in journal(run_dir) if e["event"] == "finish"] == [
        "react-toy-i0-0-1"
    ]


def test_a_collector_killed_mid_run_is_restarted_and_nothing_is_lost(
    procs: Any, tmp_path: Path
) -> None:
    engine = procs.engine("--token-delay-ms", "30")
    run_dir = tmp_path / "run"
    path = manifest(tmp_path, engine.url, tasks=2, samples=2, parallelism=1)
    args = [str(path), "--no-train", "--quiet", "--run-dir", str(run_dir), "--iterations", "1"]
    process = subprocess.Popen(
        [sys.executable, "-m", "openforge.cli", "run", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_finishes(run_dir, 1)
    killed = subprocess.run(
        ["pkill", "-9", "-f", f"[c]ollector --store {run_dir / 'store.db'}"], check=False
    )
    assert killed.returncode == 0, "no collector to kill"
    output, errors = process.communicate(timeout=300)
    assert process.returncode == 0, output + errors
    assert "collector exited with -9; restarting it" in errors
    finished = [e for e in journal(run_dir) if e["event"] == "finish"]
    assert sorted(e["index"] for e in finished) == [0, 1, 2, 3] and all(
        e["status"] == "succeeded" for e in finished
    ), finished
    assert [e for e in journal(run_dir) if e["event"] == "service"] == [
        {"event": "service", "service": "collector", "exit_code": -9, "action": "restarted"}
    ]
    with store.Store(run_dir / "store.db") as db:
        rollouts = db.rollouts("react-toy")
        assert sorted(r.rollout_id for r in rollouts) == sorted(e["rollout_id"] for e in finished)
        assert all(r.complete and r.reward == 1.0 and r.calls_stored == 2 for r in rollouts)
        assert db.lost("react-toy") == []


def test_a_runner_killed_outright_takes_its_services_and_sidecars_with_it(
    procs: Any, tmp_path: Path
) -> None:
    engine = procs.engine("--token-delay-ms", "50")
    run_dir = tmp_path / "run"
    path = manifest(tmp_path, engine.url, tasks=2, samples=2, parallelism=2)
    # harnesses that never call (and so never notice their sidecar is gone)
    agent = f'exec python "{EXAMPLES}/harnesses/react/agent.py"'
    assert agent in path.read_text()
    path.write_text(
        path.read_text().replace(agent, 'exec python -c "import time; time.sleep(600)"')
    )
    process = subprocess.Popen([sys.executable, "-m", "openforge.cli", "run", str(path),
                                "--no-train", "--quiet", "--run-dir", str(run_dir)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip

    def children() -> list[str]:
        found = subprocess.run(
            ["pgrep", "-af", f"[-]-(store|spool) {run_dir}"],
            capture_output=True,
            text=True,
            check=False,
        )
        return found.stdout.splitlines() + harnesses()

    def harnesses() -> list[str]:
        """Processes working in a rollout's directory: the harnesses."""
        found = []
        for cwd in Path("/proc").glob("[0-9]*/cwd"):
            try:
                if cwd.resolve().is_relative_to(run_dir / "rollouts"):
                    found.append(
                        f"harness {cwd.parent.name}: {(cwd.parent / 'cmdline').read_bytes()!r}"
                    )
            except OSError:
                continue
        return found

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
        harnesses() and any("sidecar" in line for line in children())
    ):
        time.sleep(0.1)
    assert any("collector" in line for line in children()) and any(
        "sidecar" in line for line in children()
    )
    assert harnesses(), "no harness seen running"
    process.kill()
    process.wait(30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and children():
        time.sleep(0.2)
    assert children() == [], "left running after the runner was killed"


def test_a_stop_while_the_services_start_ends_the_run_there(tmp_path: Path) -> None:
    """SIGTERM while the inference server loads its model: the run stops then (exit 130),
    starts nothing after it (no trainer) and leaves nothing running."""
    run_dir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "openforge.cli", "run", str(EXAMPLES / "react-toy.yaml"),
         "--run-dir", str(run_dir), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300  # the collector starts and drains first
    while not (run_dir / "serve.log").exists():
        assert process.poll() is None and time.monotonic() < deadline, "the server never started"
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    output, errors = process.communicate(timeout=60)
    assert process.returncode == 130, output + errors
    assert "stopped while serve was starting; run the same command again to continue" in errors
    assert not (run_dir / "trainer.log").exists(), "the trainer was started after the stop"
    left = subprocess.run(
        ["pgrep", "-af", f"[-]-store {run_dir}"], capture_output=True, text=True, check=False
    )
    assert left.stdout == ""


def test_a_bad_verl_key_stops_the_run_before_any_rollout(tmp_path: Path) -> None:
    """engine verl: spec.training.options are veRL keys, checked against veRL's own config
    (`openforge train-verl --check`) before anything starts."""
    path = learning_runs.example_copy(
        tmp_path, "react-toy-verl.yaml", options="      actor_rollout_ref.actor.no_such_key: 1\n"
    )
    done = run([str(path), "--run-dir", str(tmp_path / "run"), "--quiet"], env={**os.environ})
    assert done.returncode == 2, done.stderr
    assert "openforge run: RolloutJob react-toy: spec.training: veRL config:" in done.stderr
    assert "actor_rollout_ref.actor.no_such_key" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()
    workers = learning_runs.example_copy(tmp_path, "react-toy-verl.yaml")
    workers.write_text(
        workers.read_text().replace("trainer.n_gpus_per_node: 2", "trainer.n_gpus_per_node: 3")
    )
    done = run([str(workers), "--run-dir", str(tmp_path / "run"), "--quiet"], env={**os.environ})
    assert done.returncode == 2, done.stderr
    assert "workers: 3 must divide the samples of a step (8 tasks x 4)" in done.stderr
    # veRL's own vLLM servers serve the sidecars on GPUs only: said before anything starts
    own = learning_runs.example_copy(
        tmp_path, "react-toy-verl.yaml", options="      actor_rollout_ref.rollout.name: vllm\n"
    )
    done = run([str(own), "--run-dir", str(tmp_path / "run"), "--quiet"], env={**os.environ})
    assert done.returncode == 2, done.stderr
    assert "rollout: vllm (veRL's own vLLM servers) needs device cuda" in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("recorded", "example", "refused"),
    [
        # a journal from before engines were recorded: openforge trained it
        ("", "react-toy-verl.yaml", "with engine openforge, and spec.training.engine is verl"),
        (', "engine": "verl"', "react-toy.yaml", "with engine verl, and spec.training.engine is"),
    ],
)
def test_a_run_dir_is_trained_by_one_engine(
    tmp_path: Path, recorded: str, example: str, refused: str
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "journal.jsonl").write_text(
        f'{{"event": "trained", "iteration": 0, "policy_version": 1{recorded}}}\n'
    )
    manifest = learning_runs.example_copy(tmp_path, example)
    done = run([str(manifest), "--run-dir", str(run_dir)], env={**os.environ})
    assert done.returncode == 2, done.stderr
    assert f"an earlier run trained 1 iteration(s) {refused}" in done.stderr
    assert done.stderr.rstrip().endswith("; run with a new --run-dir")
    assert sorted(p.name for p in run_dir.iterdir()) == ["journal.jsonl"]  # nothing started
