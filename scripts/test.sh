#!/usr/bin/env bash
# The whole test suite: set up the environment, then lint, type-check, check
# the import contracts, and run pytest. This is what CI runs (.ci/run).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv=$(bash scripts/setup.sh | tail -n 1)
export PATH="$venv/bin:$PATH"
# Real harness CLIs from npm and a real Kubernetes control plane built from
# the Go module proxy, both cached under ~/.cache/openforge (first run: long).
bash scripts/install_harnesses.sh >&2
# Chromium + Xvfb for the GUI browser agent (apt; skipped when present).
bash scripts/install_gui_deps.sh >&2 || echo "warning: Chromium/Xvfb could not be installed; the GUI harness tests will skip" >&2
bash scripts/build_cluster_binaries.sh >&2
# ZeroClaw (Rust, crates.io) for the harness catalog: cached under ~/.cache/openforge/cargo;
# a cold build is ~19 CPU-minutes. A failed build makes its conformance test skip.
OPENFORGE_CARGO_JOBS=${OPENFORGE_CARGO_JOBS:-2} bash scripts/install_zeroclaw.sh >&2 \
  || echo "warning: ZeroClaw could not be built; its conformance test will skip" >&2
echo "== ruff"; ruff check .
echo "== mypy"; mypy
echo "== import contracts"; lint-imports
echo "== pytest"
set +e
python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi
exit "$rc"
