#!/usr/bin/env bash
# pytest in two processes side by side, on a 2-core machine: the paths in
# OPENFORGE_TEST_BESIDE (default: the Codex CLI learning run, then the real-cluster tier,
# which mostly waits on its pods) run in the background, in that order, while the rest
# runs in the foreground, serially as ever.
# The Codex run goes first: one CPU-bound run (~175 CPU-seconds an iteration) under one
# deadline; started after the kind tier, a CI run got 5 of its 10 iterations done in
# 2,200 s beside the foreground's tail. The kind tier's tests each wait on their own
# pods. The background's
# output follows the foreground's. Arguments go to both. Naming a test path, or
# OPENFORGE_TEST_SERIAL=1, runs one pytest, as given.
# Exit status: the larger of the two, where 5 (nothing collected) counts only if both
# collected nothing.
set -uo pipefail
read -r -a beside <<<"${OPENFORGE_TEST_BESIDE:-tests/runner/test_learning_codex.py tests/kind}"
split=1
[ "${OPENFORGE_TEST_SERIAL:-0}" = 1 ] && split=0
for arg in "$@"; do
  case "$arg" in -*) ;; *) if [ -e "${arg%%::*}" ]; then split=0; fi ;; esac
done
for path in "${beside[@]}"; do
  [ -e "$path" ] || { echo "pytest_split.sh: $path (OPENFORGE_TEST_BESIDE) does not exist" >&2; exit 2; }
done
if [ "$split" = 0 ]; then
  echo "== pytest"
  exec python -m pytest "$@"
fi
ignores=()
for path in "${beside[@]}"; do ignores+=("--ignore=$path"); done
work=$(mktemp -d)
echo "== pytest: ${beside[*]} in the background (printed at the end), the rest here"
python -m pytest --basetemp="$work/tmp" "$@" "${beside[@]}" >"$work/log" 2>&1 &
beside_pid=$!
trap 'kill "$beside_pid" 2>/dev/null; rm -rf "$work"' EXIT
python -m pytest "$@" "${ignores[@]}"
rest=$?
wait "$beside_pid"
other=$?
echo "== pytest: ${beside[*]}"
cat "$work/log"
echo "pytest_split.sh: exit $rest for the rest, $other for ${beside[*]}" >&2
if [ "$rest" = 5 ]; then exit "$other"; fi
if [ "$other" = 5 ]; then exit "$rest"; fi
exit $((rest > other ? rest : other))
