#!/usr/bin/env bash
# Set up (or reuse) the project's virtual environment under ~/.cache/openforge/venv.
# Idempotent: the pinned install (constraints.txt, all extras) is redone only
# when pyproject.toml or constraints.txt changed since the last one; the
# editable install of this checkout is refreshed every time (a CI clone lives
# in another folder). Prints the venv path on its last line, and nothing else
# unless a step fails: then that step's whole output, on stderr. (The first
# time takes several minutes: torch is large.)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${OPENFORGE_CACHE:-$HOME/.cache/openforge}
venv="$cache/venv"
stamp="$venv/.openforge-stamp"
key=$(cat "$root/pyproject.toml" "$root/constraints.txt" | sha256sum | cut -c1-16)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
quiet() { # run a step; its output only if it fails
  if ! "$@" >"$log" 2>&1; then
    echo "scripts/setup.sh: failed: $*" >&2
    cat "$log" >&2
    exit 1
  fi
}
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$cache"
  quiet python3 -m venv "$venv"
  quiet "$venv/bin/python" -m pip install -q --upgrade pip
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$key" ]; then
  quiet "$venv/bin/python" -m pip install -q -c "$root/constraints.txt" -e "$root[test,train,operator]"
  echo "$key" > "$stamp"
else
  quiet "$venv/bin/python" -m pip install -q --no-deps -e "$root"
fi
echo "$venv"
