#!/usr/bin/env bash
# Set up (or reuse) the project's virtual environment under ~/.cache/openforge/venv.
# Idempotent: the pinned install (constraints.txt, all extras) is redone only
# when pyproject.toml or constraints.txt changed since the last one; the
# editable install of this checkout is refreshed every time (a CI clone lives
# in another folder). Prints the venv path on its last line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${OPENFORGE_CACHE:-$HOME/.cache/openforge}
venv="$cache/venv"
stamp="$venv/.openforge-stamp"
key=$(cat "$root/pyproject.toml" "$root/constraints.txt" | sha256sum | cut -c1-16)
if [ ! -x "$venv/bin/python" ]; then
  echo "openforge: creating $venv" >&2
  mkdir -p "$cache"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$key" ]; then
  echo "openforge: installing pinned dependencies into $venv (first time: several minutes, torch is large)" >&2
  "$venv/bin/python" -m pip install -q -c "$root/constraints.txt" -e "$root[test,train,operator]" >&2
  echo "$key" > "$stamp"
else
  "$venv/bin/python" -m pip install -q --no-deps -e "$root" >&2
fi
echo "$venv"
