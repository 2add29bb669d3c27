#!/usr/bin/env bash
# Set up (or reuse) the project's virtual environment under ~/.cache/openforge.
# Idempotent: the venv is keyed by the hash of pyproject.toml + constraints.txt,
# so a change to either builds a fresh one and an unchanged tree reuses it.
# Prints the venv path on its last line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${OPENFORGE_CACHE:-$HOME/.cache/openforge}
key=$(cat "$root/pyproject.toml" "$root/constraints.txt" | sha256sum | cut -c1-12)
venv="$cache/venv-$key"
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
  echo "openforge: creating $venv" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -m pip install -q -c "$root/constraints.txt" -e "$root[test]" >&2
  touch "$venv/.complete"
else
  # the editable install points at this checkout
  "$venv/bin/python" -m pip install -q --no-deps -e "$root" >&2
fi
echo "$venv"
