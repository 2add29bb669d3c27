#!/usr/bin/env bash
# Build (or reuse) the binaries of the local test control plane: etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok, helm.
#
# Everything is compiled from the Go module proxy with `go build`; the pinned
# versions live in the committed modules under scripts/cluster/go/<tool>/
# (go.mod + go.sum, built with -mod=readonly so nothing floats). Binaries go to
# $OPENFORGE_CACHE/bin/<key>/ (default ~/.cache/openforge/bin/...), where <key>
# is the Kubernetes version plus a hash of the pins, the Go version and the
# link flags: a changed pin builds into a fresh folder, an unchanged one is
# reused. The module and build caches live under $OPENFORGE_CACHE/go, so a
# rebuild after a pin bump recompiles only what changed.
#
# Usage:
#   build_cluster_binaries.sh           build what is missing; print NAME=PATH
#                                       lines, the bin folder on the last line
#   build_cluster_binaries.sh --check   build nothing; same output, exit 1 if
#                                       any binary is missing
#
# Environment: OPENFORGE_CACHE, OPENFORGE_GO (the go binary; default `go` on
# PATH, then /usr/local/go/bin/go), OPENFORGE_BUILD_JOBS (go build -p, default 2).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mods="$root/scripts/cluster/go"
cache=${OPENFORGE_CACHE:-$HOME/.cache/openforge}
jobs=${OPENFORGE_BUILD_JOBS:-2}
mode=build
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

go=${OPENFORGE_GO:-$(command -v go || echo /usr/local/go/bin/go)}
if [ ! -x "$go" ]; then
  echo "build_cluster_binaries: no Go toolchain (set OPENFORGE_GO or put go on PATH)" >&2
  exit 1
fi

export GOMODCACHE="$cache/go/mod"
export GOCACHE="$cache/go/build"
export GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -trimpath -buildvcs=false"
export CGO_ENABLED=0

# The module version a tool module pins, read from its go.mod.
pinned() { # <module dir> <module path>
  awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$mods/$1/go.mod"
}

k8s=$(pinned kubernetes k8s.io/kubernetes)
etcd=$(pinned etcd go.etcd.io/etcd/server/v3)
kwok=$(pinned kwok sigs.k8s.io/kwok)
helm=$(pinned helm helm.sh/helm/v4)
for v in k8s etcd kwok helm; do
  if [ -z "${!v}" ]; then echo "build_cluster_binaries: no $v version in $mods/*/go.mod" >&2; exit 1; fi
done

k8s_minor=$(echo "$k8s" | cut -d. -f2)
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=$k8s -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=module-proxy"
  kube_ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
etcd_ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=module-proxy"
kwok_ldflags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${kwok#v} -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${k8s#v}"
helm_ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$helm -X helm.sh/helm/v4/internal/version.gitTreeState=clean"

# name | module dir | package | ldflags
targets=(
  "etcd|etcd|go.etcd.io/etcd/server/v3|$etcd_ldflags"
  "kube-apiserver|kubernetes|k8s.io/kubernetes/cmd/kube-apiserver|$kube_ldflags"
  "kube-controller-manager|kubernetes|k8s.io/kubernetes/cmd/kube-controller-manager|$kube_ldflags"
  "kube-scheduler|kubernetes|k8s.io/kubernetes/cmd/kube-scheduler|$kube_ldflags"
  "kubectl|kubernetes|k8s.io/kubernetes/cmd/kubectl|$kube_ldflags"
  "kwok|kwok|sigs.k8s.io/kwok/cmd/kwok|$kwok_ldflags"
  "helm|helm|helm.sh/helm/v4/cmd/helm|$helm_ldflags"
)

key=$({ "$go" env GOVERSION GOOS GOARCH; cat "$mods"/*/go.mod "$mods"/*/go.sum; printf '%s\n' "${targets[@]}"; } | sha256sum | cut -c1-12)
bin="$cache/bin/$k8s-$key"

missing=()
for t in "${targets[@]}"; do
  name=${t%%|*}
  [ -x "$bin/$name" ] || missing+=("$t")
done

if [ "$mode" = build ] && [ "${#missing[@]}" -gt 0 ]; then
  mkdir -p "$bin"
  exec 9>"$bin/.lock"
  flock 9  # a concurrent build of the same key waits, then finds the binaries
  echo "build_cluster_binaries: building into $bin (kubernetes $k8s, etcd $etcd, kwok $kwok, helm $helm; go build -p $jobs)" >&2
  for t in "${missing[@]}"; do
    IFS='|' read -r name dir pkg ldflags <<<"$t"
    [ -x "$bin/$name" ] && continue
    start=$SECONDS
    (cd "$mods/$dir" && "$go" build -p "$jobs" -ldflags "$ldflags" -o "$bin/.$name.tmp" "$pkg")
    mv "$bin/.$name.tmp" "$bin/$name"
    echo "build_cluster_binaries: $name in $((SECONDS - start)) s" >&2
  done
  missing=()
fi

for t in "${targets[@]}"; do
  name=${t%%|*}
  echo "$name=$bin/$name"
done
echo "$bin"
if [ "${#missing[@]}" -gt 0 ]; then
  echo "build_cluster_binaries: not built: ${missing[*]%%|*} (run $0)" >&2
  exit 1
fi
