#!/usr/bin/env bash
# Build ZeroClaw (the Rust crate `zeroclaw` from crates.io) at a pinned version, for the
# harness catalog's examples/harnesses/zeroclaw.
#
#   scripts/install_zeroclaw.sh            build if missing, then print ZEROCLAW_BIN=path
#
# Installs with `cargo install --locked` into ${OPENFORGE_CARGO_ROOT:-~/.cache/openforge/cargo}
# (the binary is <root>/bin/zeroclaw); cargo's own registry and build caches stay in ~/.cargo.
# zeroclaw 0.8.7 declares rust-version 1.96: the default toolchain is used when it is new
# enough, else `nightly` when rustup has one, else ZEROCLAW_TOOLCHAIN names one (e.g. 1.96.0).
# OPENFORGE_CARGO_JOBS (default 1) caps parallel rustc jobs: the build peaks near 1 GB per job.
# A cold build is long (~40 min with -j 1 on a busy 2-core machine; see docs/harnesses.md);
# a rerun with the pinned version installed takes well under a second.
#
# Idempotent: skipped when <root>/bin/zeroclaw answers --version with the pinned version.
# Progress and cargo's output go to stderr; the last line on stdout is ZEROCLAW_BIN=<path>.
set -euo pipefail

ZEROCLAW_VERSION="0.8.7"
MIN_RUST="1.96.0"

ROOT="${OPENFORGE_CARGO_ROOT:-$HOME/.cache/openforge/cargo}"
ZEROCLAW_BIN="$ROOT/bin/zeroclaw"
JOBS="${OPENFORGE_CARGO_JOBS:-1}"

die() { echo "install_zeroclaw: ERROR: $*" >&2; exit 1; }
log() { echo "install_zeroclaw: $*" >&2; }

installed_version() {
  [ -x "$ZEROCLAW_BIN" ] || return 0
  "$ZEROCLAW_BIN" --version 2>/dev/null | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -n 1 || true
}

if [ "$(installed_version)" = "$ZEROCLAW_VERSION" ]; then
  log "zeroclaw $ZEROCLAW_VERSION already installed, skipping"
  echo "ZEROCLAW_BIN=$ZEROCLAW_BIN"
  exit 0
fi

command -v cargo >/dev/null || die "cargo not found on PATH (install Rust with rustup)"

version_ok() { # rustc-version-string -> 0 when >= MIN_RUST
  local have
  have="$(echo "$1" | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -n 1)"
  [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$MIN_RUST" "$have" | sort -V | head -n 1)" = "$MIN_RUST" ]
}

toolchain="${ZEROCLAW_TOOLCHAIN:-}"
if [ -z "$toolchain" ]; then
  if version_ok "$(rustc --version 2>/dev/null || true)"; then
    toolchain=""
  elif command -v rustup >/dev/null && version_ok "$(rustc +nightly --version 2>/dev/null || true)"; then
    toolchain="nightly"
  else
    die "zeroclaw $ZEROCLAW_VERSION needs rustc >= $MIN_RUST; the default is $(rustc --version 2>/dev/null || echo missing) and there is no such nightly: rustup toolchain install nightly (or set ZEROCLAW_TOOLCHAIN)"
  fi
fi
cargo_cmd=(cargo)
[ -n "$toolchain" ] && cargo_cmd+=("+$toolchain")
log "building zeroclaw $ZEROCLAW_VERSION with $("${cargo_cmd[@]}" --version) into $ROOT (-j $JOBS; a cold build takes tens of minutes)"

# zeroclaw's own release profile (opt-level "z", fat LTO, one codegen unit) buys a small
# binary with a long, mostly serial build; the conformance test needs neither. Cargo lets
# the environment override a package's profile: no LTO, 16 codegen units, no optimization
# (ZEROCLAW_PROFILE=upstream keeps the crate's own).
if [ "${ZEROCLAW_PROFILE:-fast}" = fast ]; then
  export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_PROFILE_RELEASE_OPT_LEVEL=0
fi
started=$(date +%s)
"${cargo_cmd[@]}" install zeroclaw --version "$ZEROCLAW_VERSION" --locked --root "$ROOT" -j "$JOBS" >&2 \
  || die "cargo install zeroclaw@$ZEROCLAW_VERSION failed (output above)"
[ "$(installed_version)" = "$ZEROCLAW_VERSION" ] \
  || die "after the build $ZEROCLAW_BIN does not report version $ZEROCLAW_VERSION"
log "zeroclaw $ZEROCLAW_VERSION built in $(( $(date +%s) - started )) s"
echo "ZEROCLAW_BIN=$ZEROCLAW_BIN"
