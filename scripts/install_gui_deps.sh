#!/usr/bin/env bash
# Install what the GUI browser harness (examples/harnesses/gui-browser) needs from
# Debian's packages: Chromium, the Xvfb virtual X server, and one font so pages render text.
#
#   scripts/install_gui_deps.sh        install what is missing, then print paths
#
# Idempotent and fast when everything is present (no apt call at all then). Needs root
# (apt-get) only when something is missing. On success the last lines are KEY=path pairs
# (CHROMIUM_BIN, XVFB_BIN) that callers may eval.
set -euo pipefail

PACKAGES=(chromium xvfb fonts-dejavu-core)

die() { echo "install_gui_deps: ERROR: $*" >&2; exit 1; }
log() { echo "install_gui_deps: $*" >&2; }

missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v Xvfb >/dev/null 2>&1 || missing+=(xvfb)
[ -d /usr/share/fonts/truetype/dejavu ] || missing+=(fonts-dejavu-core)

if [ "${#missing[@]}" -gt 0 ]; then
  command -v apt-get >/dev/null 2>&1 || die "missing ${missing[*]} and there is no apt-get to install them"
  [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}; run as root (apt-get) or install: ${PACKAGES[*]}"
  log "installing ${missing[*]} with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt_log="$(mktemp)"
  if ! { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$apt_log" 2>&1; then
    cat "$apt_log" >&2
    rm -f "$apt_log"
    die "apt-get install ${missing[*]} failed (log above)"
  fi
  rm -f "$apt_log"
fi

# Debian's /usr/bin/chromium is a shell wrapper that adds Google API keys and remote
# extensions from /etc/chromium.d; the harness runs the browser binary behind it directly.
chromium_bin=/usr/lib/chromium/chromium
[ -x "$chromium_bin" ] || chromium_bin="$(command -v chromium)" || die "chromium is still not on PATH"
xvfb_bin="$(command -v Xvfb)" || die "Xvfb is still not on PATH"
"$chromium_bin" --version >&2 || die "$chromium_bin does not run"
echo "CHROMIUM_BIN=$chromium_bin"
echo "XVFB_BIN=$xvfb_bin"
