#!/usr/bin/env bash
# Build (or reuse) the offline kind node image; no image registry is needed.
#
#   scripts/kind/node.sh          print NAME=PATH for kind and the node binaries,
#                                 then the node image on the last line
#   scripts/kind/node.sh --bin    the binaries only (kind, crictl, ...), no image
#
# 1. Binaries, in $OPENFORGE_CACHE/kind/bin/<k8s>-<key>/, <key> hashing the
#    pins, Go version and flags: kubelet, kubeadm, kube-proxy from
#    scripts/kind/go/kubernetes (the pins of scripts/cluster/go/kubernetes plus
#    the modules only these three import) with the flags and caches of
#    scripts/build_cluster_binaries.sh (which provides kube-apiserver,
#    kube-controller-manager, kube-scheduler, kubectl and etcd); kind, crictl
#    and CoreDNS from the other modules in scripts/kind/go/; pause from pause.c.
# 2. openforge/kind-base:<key>: scripts/kind/base.Dockerfile on
#    openforge/debian:bookworm with kind's images/base/files.
# 3. The control-plane images, tagged as `kubeadm config images list` names
#    them, each one binary (kube-proxy also nftables and conntrack).
# 4. openforge/kind-node:<k8s>-<key>: a base container given the binaries,
#    /kind/version, and the images imported into its containerd (namespace
#    k8s.io; also kube-router from scripts/kind/go/kube-router, which
#    scripts/kind-up.sh installs for NetworkPolicy), then `docker commit`ed. Saved to
#    $OPENFORGE_CACHE/kind/node-<k8s>-<key>.tar: a new Docker daemon loads it
#    in seconds instead of rebuilding.
#
# Environment: OPENFORGE_CACHE, OPENFORGE_GO, OPENFORGE_BUILD_JOBS (go build -p,
# default 2), DOCKER (default docker).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here="$root/scripts/kind"
cache=${OPENFORGE_CACHE:-$HOME/.cache/openforge}
jobs=${OPENFORGE_BUILD_JOBS:-2}
docker=${DOCKER:-docker}
pod_subnet=10.244.0.0/16
node_pod_subnet=10.244.0.0/24 # the single node's share (kube-controller-manager allocates it too)
service_subnet=10.96.0.0/16
mode=image
case "${1:-}" in
  "") ;;
  --bin) mode=bin ;;
  *) echo "usage: $0 [--bin]" >&2; exit 2 ;;
esac

log=$(mktemp)
tmp=$(mktemp -d)
cleanup() { rm -rf "$log" "$tmp"; [ -z "${cid:-}" ] || "$docker" rm -f "$cid" >/dev/null 2>&1 || true; }
trap cleanup EXIT
run() { # quiet unless it fails: then its whole output
  if ! "$@" >"$log" 2>&1; then cat "$log" >&2; echo "kind/node.sh: failed: $*" >&2; exit 1; fi
}
say() { echo "kind/node.sh: $*" >&2; }

go=${OPENFORGE_GO:-$(command -v go || echo /usr/local/go/bin/go)}
[ -x "$go" ] || { say "no Go toolchain (set OPENFORGE_GO or put go on PATH)"; exit 1; }
export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -trimpath -buildvcs=false" CGO_ENABLED=0

pinned() { # <go.mod> <module path>
  awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1"
}
k8s=$(pinned "$root/scripts/cluster/go/kubernetes/go.mod" k8s.io/kubernetes)
kind_version=$(pinned "$here/go/kind/go.mod" sigs.k8s.io/kind)
crictl_version=$(pinned "$here/go/crictl/go.mod" sigs.k8s.io/cri-tools)
kube_router_version=$(pinned "$here/go/kube-router/go.mod" github.com/cloudnativelabs/kube-router/v2)
[ -n "$k8s" ] && [ -n "$kind_version" ] && [ -n "$crictl_version" ] && [ -n "$kube_router_version" ] || { say "no pinned versions in the go.mod files"; exit 1; }

# The same link flags as scripts/build_cluster_binaries.sh, so the packages it
# compiled for kube-apiserver are reused from GOCACHE.
k8s_minor=$(echo "$k8s" | cut -d. -f2)
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=$k8s -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
  kube_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=module-proxy"
  kube_ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
# name | module dir | package | ldflags
targets=(
  "kind|$here/go/kind|sigs.k8s.io/kind|-s -w"
  "crictl|$here/go/crictl|sigs.k8s.io/cri-tools/cmd/crictl|-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$crictl_version"
  "coredns|$here/go/coredns|.|-s -w"
  "kube-router|$here/go/kube-router|github.com/cloudnativelabs/kube-router/v2/cmd/kube-router|-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$kube_router_version"
  "kubelet|$here/go/kubernetes|k8s.io/kubernetes/cmd/kubelet|$kube_ldflags"
  "kubeadm|$here/go/kubernetes|k8s.io/kubernetes/cmd/kubeadm|$kube_ldflags"
  "kube-proxy|$here/go/kubernetes|k8s.io/kubernetes/cmd/kube-proxy|$kube_ldflags"
)
key=$({ "$go" env GOVERSION GOOS GOARCH; gcc --version 2>/dev/null | head -n 1
        cat "$root"/scripts/cluster/go/kubernetes/go.{mod,sum} "$here"/go/*/go.{mod,sum} "$here"/go/*/*.go "$here/pause.c"
        printf '%s\n' "${targets[@]}"; } | sha256sum | cut -c1-12)
bin="$cache/kind/bin/$k8s-$key"
mkdir -p "$bin"
exec 9>"$bin/.lock"
flock 9 # a concurrent build of the same key waits, then finds the binaries
build_one() { # <name> <dir> <pkg> <ldflags>
  local start=$SECONDS
  (cd "$2" && run "$go" build -p "$jobs" -ldflags "$4" -o "$bin/.$1.tmp" "$3")
  mv "$bin/.$1.tmp" "$bin/$1"
  say "built $1 in $((SECONDS - start)) s"
}
for t in "${targets[@]}"; do
  IFS='|' read -r name dir pkg ldflags <<<"$t"
  [ "$mode" = bin ] && [[ $dir == */go/kubernetes ]] && continue
  [ -x "$bin/$name" ] || build_one "$name" "$dir" "$pkg" "$ldflags"
done
if [ ! -x "$bin/pause" ]; then
  run gcc -static -Os -Wall -o "$bin/.pause.tmp" "$here/pause.c"
  run strip "$bin/.pause.tmp"
  mv "$bin/.pause.tmp" "$bin/pause"
fi
for t in "${targets[@]}" pause; do
  name=${t%%|*}
  [ -x "$bin/$name" ] && echo "$name=$bin/$name"
done
[ "$mode" = bin ] && exit 0

# --- the node image --------------------------------------------------------
kind_src="$GOMODCACHE/sigs.k8s.io/kind@$kind_version"
[ -d "$kind_src/images/base/files" ] || (cd "$here/go/kind" && run "$go" mod download sigs.k8s.io/kind)
base_key=$({ cat "$here/base.Dockerfile"; find "$here/files" "$kind_src/images/base/files" -type f | sort | xargs cat; } | sha256sum | cut -c1-12)
base_image="openforge/kind-base:$base_key"
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd
cluster_bins=$(bash "$root/scripts/build_cluster_binaries.sh" 2>"$log") || { cat "$log" >&2; exit 1; }
cluster_bin=$(echo "$cluster_bins" | tail -n 1)
node_key=$({ echo "$key $base_key $cluster_bin $pod_subnet $node_pod_subnet $service_subnet"; cat "$0" "$here"/go/*/go.sum; } | sha256sum | cut -c1-12)
node_image="openforge/kind-node:$k8s-$node_key"
tarball="$cache/kind/node-$k8s-$node_key.tar"
has() { "$docker" image inspect "$1" >/dev/null 2>&1; }

if has "$node_image"; then echo "$node_image"; exit 0; fi
if [ -s "$tarball" ]; then
  start=$SECONDS
  run "$docker" load -i "$tarball"
  say "loaded $node_image from $tarball in $((SECONDS - start)) s"
  echo "$node_image"
  exit 0
fi
bash "$root/scripts/docker.sh"
total=$SECONDS

if ! has "$base_image"; then
  has openforge/debian:bookworm || run bash "$root/scripts/images.sh" base
  start=$SECONDS
  mkdir -p "$tmp/base"
  cp -r "$kind_src/images/base/files" "$tmp/base/kind-files"
  chmod -R u+w "$tmp/base"
  cp -r "$here/files" "$tmp/base/files"
  run "$docker" build --network host --build-arg BASE_IMAGE=openforge/debian:bookworm \
    -t "$base_image" -f "$here/base.Dockerfile" "$tmp/base"
  say "built $base_image in $((SECONDS - start)) s"
fi

# Control-plane images, tagged as kubeadm names them.
start=$SECONDS
mapfile -t required < <("$bin/kubeadm" config images list --kubernetes-version "$k8s" 2>"$log") ||
  { cat "$log" >&2; exit 1; }
images=()
pause_image=""
coredns_image=""
for image in "${required[@]}"; do
  name=${image%:*}
  name=${name##*/}
  ctx="$tmp/img-$name"
  mkdir -p "$ctx/root/usr/local/bin" "$ctx/root/tmp"
  from=scratch
  entry=""
  case "$name" in
    kube-apiserver | kube-controller-manager | kube-scheduler | etcd)
      cp "$cluster_bin/$name" "$ctx/root/usr/local/bin/" ;;
    kube-proxy)
      cp "$bin/kube-proxy" "$ctx/root/usr/local/bin/"
      from=openforge/debian:bookworm ;;
    coredns)
      cp "$bin/coredns" "$ctx/root/coredns"
      entry='ENTRYPOINT ["/coredns"]'
      coredns_image=$image ;;
    pause)
      cp "$bin/pause" "$ctx/root/pause"
      entry='ENTRYPOINT ["/pause"]'
      pause_image=$image ;;
    *) say "kubeadm wants $image, which this script does not know how to build"; exit 1 ;;
  esac
  {
    echo "FROM $from"
    if [ "$from" != scratch ]; then
      echo 'RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nftables iptables conntrack && rm -rf /var/lib/apt/lists/*'
    fi
    echo 'COPY root/ /'
    echo 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
    echo "$entry"
  } >"$ctx/Dockerfile"
  run "$docker" build --network host -t "$image" "$ctx"
  images+=("$image")
done
[ -n "$pause_image" ] && [ -n "$coredns_image" ] || { say "kubeadm named no pause or coredns image"; exit 1; }
# NetworkPolicy enforcement (scripts/kind/network-policy.yaml)
kube_router_image="openforge/kube-router:$kube_router_version"
mkdir -p "$tmp/img-kube-router/root/usr/local/bin"
cp "$bin/kube-router" "$tmp/img-kube-router/root/usr/local/bin/"
cat >"$tmp/img-kube-router/Dockerfile" <<'EOF'
FROM openforge/debian:bookworm
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends iptables ipset iproute2 conntrack && rm -rf /var/lib/apt/lists/*
COPY root/ /
ENTRYPOINT ["/usr/local/bin/kube-router"]
EOF
run "$docker" build --network host -t "$kube_router_image" "$tmp/img-kube-router"
images+=("$kube_router_image")
run "$docker" save -o "$tmp/images.tar" "${images[@]}"
say "built ${#images[@]} images in $((SECONDS - start)) s"

# Assemble the node in a running base container, as kind's `build node-image` does.
start=$SECONDS
cid=$("$docker" run -d --entrypoint sleep "$base_image" infinity)
for b in "$bin/kubelet" "$bin/kubeadm" "$cluster_bin/kubectl"; do run "$docker" cp "$b" "$cid:/usr/bin/"; done
run "$docker" cp "$bin/crictl" "$cid:/usr/local/bin/"
run "$docker" cp "$tmp/images.tar" "$cid:/kind/images.tar"
run "$docker" exec -i "$cid" bash -euc "
  chown root:root /usr/bin/kubelet /usr/bin/kubeadm /usr/bin/kubectl /usr/local/bin/crictl
  echo -n '$k8s' >/kind/version
  echo -n '$node_pod_subnet' >/kind/openforge/pod-subnet
  echo -n '$coredns_image' >/kind/openforge/coredns-image
  echo -n '$kube_router_image' >/kind/openforge/kube-router-image
  sed -i 's#@PAUSE_IMAGE@#$pause_image#' /etc/containerd/config.toml
  sed -i 's#@POD_SUBNET@#$node_pod_subnet#' /etc/cni/net.d/10-openforge.conflist
  nohup containerd >/tmp/containerd.log 2>&1 &
  for i in \$(seq 1 50); do [ -S /run/containerd/containerd.sock ] && break; sleep 0.2; done
  ctr version >/dev/null
  ctr --namespace=k8s.io images import --all-platforms --no-unpack --digests /kind/images.tar
  ctr --namespace=k8s.io images list -q
  pkill containerd
  for i in \$(seq 1 50); do pgrep -x containerd >/dev/null || break; sleep 0.2; done
  rm -f /kind/images.tar /tmp/containerd.log
"
for image in "${images[@]}"; do
  # (containerd lists a name without a registry under its default registry)
  awk -v i="$image" '$0 == i || substr($0, length($0) - length(i)) == "/" i { f = 1 } END { exit !f }' "$log" ||
    { cat "$log" >&2; say "$image is not in the node's containerd"; exit 1; }
done
run "$docker" commit \
  --change 'ENTRYPOINT ["/usr/local/bin/openforge-entrypoint", "/usr/local/bin/entrypoint", "/sbin/init"]' \
  --change 'CMD []' "$cid" "$node_image"
"$docker" rm -f "$cid" >/dev/null
cid=""
say "assembled $node_image in $((SECONDS - start)) s"
start=$SECONDS
mkdir -p "$cache/kind"
rm -f "$cache"/kind/node-*.tar # one node tarball at a time, one image, one bin folder
for old in "$cache"/kind/bin/*; do [ "$old" = "$bin" ] || rm -rf "$old"; done
for old in $("$docker" images --format '{{.Repository}}:{{.Tag}}' openforge/kind-node) \
           $("$docker" images --format '{{.Repository}}:{{.Tag}}' openforge/kind-base); do
  [ "$old" = "$node_image" ] || [ "$old" = "$base_image" ] || "$docker" rmi "$old" >/dev/null 2>&1 || true
done
run "$docker" save -o "$tarball.tmp" "$node_image"
mv "$tarball.tmp" "$tarball"
say "saved $tarball in $((SECONDS - start)) s (node image built in $((SECONDS - total)) s)"
echo "$node_image"
