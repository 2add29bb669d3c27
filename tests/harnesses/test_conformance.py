"""Conformance: every catalog harness, the same toy tasks, through ``openforge run``.

Each catalog harness's committed ``harnessenv.yaml`` runs two toy tasks
(``conformance.TASK_IDS``; the GUI agent two web-forms tasks of its own) with
``openforge run ... --no-train --iterations 1`` against the deterministic test engine, with
``HTTP(S)_PROXY`` pointing at a proxy that refuses and records everything. It must yield complete,
graded (1.0), token-exact trajectories and no outbound request
(:func:`conformance.check`), and what it measured must agree with its row
of the committed matrix in docs/harnesses.md (regenerate with
``python tests/harnesses/conformance.py --write docs/harnesses.md``).
A harness whose CLI is not installed is skipped, naming the install script.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import conformance
import httpx
import pytest
from openforge_trainer.testengine import engine as testengine

pytestmark = pytest.mark.harness


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    url, stop = testengine.start_in_thread()
    yield url
    stop()


@pytest.fixture
def engine_answer(engine: str) -> Callable[[list[int]], dict[str, Any]]:
    def ask(prompt_ids: list[int]) -> dict[str, Any]:
        body = {"model": conformance.ENGINE_MODEL, "prompt": prompt_ids, "max_tokens": 1024,
                "logprobs": 1, "return_token_ids": True, "skip_special_tokens": False}  # fmt: skip
        response = httpx.post(f"{engine}/v1/completions", json=body, timeout=30)
        response.raise_for_status()
        choice: dict[str, Any] = response.json()["choices"][0]
        return choice

    return ask


def committed_row(name: str) -> dict[str, str]:
    rows = conformance.parse_table(conformance.MATRIX_DOC.read_text())
    row = next((r for r in rows if r["harness"].strip("`") == name), None)
    assert row is not None, (
        f"no row for {name} in {conformance.MATRIX_DOC}; run: {conformance.COMMAND}"
    )
    return row


# Same as in the committed matrix; prompt tokens only roughly (they hold dates and paths).
EXACT = ("wire API", "streaming", "calls per task", "merge rate", "side calls seen", "reward")


# OpenClaw alone spends 10-30 s of CPU starting up, per rollout.
SLOW = {"openclaw"}


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW else []) for n in conformance.CATALOG],
)
def test_the_harness_conforms(
    name: str, engine: str, engine_answer: Callable[[list[int]], dict[str, Any]], tmp_path: Path
) -> None:
    harness = conformance.CATALOG[name]
    if not harness.manifest.is_file():
        pytest.skip(f"{harness.manifest} is not in the catalog yet")
    if harness.missing():
        pytest.skip(f"not installed: {', '.join(harness.missing())}; run {harness.install}")
    result = conformance.run(harness, engine_url=engine, work=tmp_path)
    conformance.check(result, engine_answer=engine_answer)
    row = dict(zip(conformance.COLUMNS, conformance.measure(result).cells, strict=True))
    committed = committed_row(name)
    assert {k: row[k] for k in EXACT} == {k: committed[k] for k in EXACT}, conformance.COMMAND
    measured, recorded = (
        int(r["prompt tokens (first call)"].replace(",", "")) for r in (row, committed)
    )
    assert abs(measured - recorded) <= 0.1 * recorded, (measured, recorded, conformance.COMMAND)
