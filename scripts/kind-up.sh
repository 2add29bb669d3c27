#!/usr/bin/env bash
# A kind cluster (Kubernetes in Docker) that runs real pods, built and started
# fully offline: no image registry is needed (docs/kind.md).
#
#   scripts/kind-up.sh up            create (or reuse) the cluster; the kubeconfig path on stdout's last line
#   scripts/kind-up.sh load IMAGE... load local Docker images into the nodes
#   scripts/kind-up.sh images        build the OpenForge images (scripts/images.sh) and load them
#   scripts/kind-up.sh demo          helm-install the chart and apply examples/cluster (docs/cluster.md)
#   scripts/kind-up.sh demo-down     delete what demo made (the rl and openforge namespaces, the release)
#   scripts/kind-up.sh kubeconfig    print the kubeconfig path
#   scripts/kind-up.sh down          delete the cluster and what `up` made (caches stay)
#   KUBECONFIG=$(scripts/kind-up.sh kubeconfig) python -m pytest -m cluster
#
# Node image: KIND_NODE_IMAGE if set, else a local kindest/node image if Docker
# has one (kind's own path: kindnetd, CoreDNS forwarding to the host's
# resolver, KIND_WORKERS workers, default 2), else the offline node that
# scripts/kind/node.sh builds and caches in $OPENFORGE_CACHE/kind: one
# untainted control-plane node, bridge CNI, CoreDNS answering cluster names
# only, NetworkPolicy enforced by kube-router (firewall only; KIND_NETWORK_POLICY=0:
# not installed), and no packet from a pod or the node leaving the machine.
# On a host whose Docker refuses `--privileged` (detected by trying), kind's
# `docker run` goes through scripts/kind/docker-shim.
#
# Environment: KIND_CLUSTER (default openforge), KIND_NODE_IMAGE, KIND_WORKERS,
# KIND (a kind binary; default: built from scripts/kind/go/kind), KIND_LOAD_IMAGES
# (space-separated images `up` also loads), OPENFORGE_CACHE, HELM and KUBECTL
# (for `demo`; default: those of scripts/build_cluster_binaries.sh).
# The API server listens on 127.0.0.1 only. The kubeconfig goes to
# ${OPENFORGE_CACHE:-~/.cache/openforge}/kind/<name>.kubeconfig.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${OPENFORGE_CACHE:-$HOME/.cache/openforge}
name=${KIND_CLUSTER:-openforge}
kubeconfig="$cache/kind/$name.kubeconfig"
rundir="$cache/kind/run/$name" # the docker shim and its state; removed by `down`

die() { echo "kind-up.sh: $*" >&2; exit 1; }
say() { echo "kind-up.sh: $*" >&2; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
run() { # quiet unless it fails: then its whole output
  if ! "$@" >"$log" 2>&1; then cat "$log" >&2; die "failed: $*"; fi
}

real_docker=$(command -v docker || true)

kind_bin() {
  if [ -n "${KIND:-}" ]; then echo "$KIND"; return; fi
  local out
  out=$(bash "$root/scripts/kind/node.sh" --bin 2>"$log") || { cat "$log" >&2; exit 1; }
  echo "$out" | sed -n 's/^kind=//p'
}

# kind, with the docker shim first on its PATH when the cluster has one.
kind_() {
  if [ -x "$rundir/bin/docker" ]; then PATH="$rundir/bin:$PATH" "$kind" "$@"; else "$kind" "$@"; fi
}

exists() { kind_ get clusters 2>/dev/null | grep -qx "$name"; }

# Write the shim when this Docker refuses --privileged (tried with the image).
shim() { # <image>
  local unprivileged=0
  mkdir -p "$rundir/bin"
  if ! "$real_docker" run --rm --privileged --entrypoint true "$1" >"$log" 2>&1; then
    grep -q "unable to apply caps" "$log" || { cat "$log" >&2; die "docker run --privileged $1 failed"; }
    unprivileged=1
    say "this Docker refuses --privileged (unable to apply caps); nodes get explicit capabilities instead"
  fi
  sed -e "s#@DOCKER@#$real_docker#" -e "s#@UNPRIVILEGED@#$unprivileged#" \
    "$root/scripts/kind/docker-shim" >"$rundir/bin/docker"
  chmod +x "$rundir/bin/docker"
}

offline_config() {
  cat <<'EOF'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  apiServerAddress: "127.0.0.1"
  disableDefaultCNI: true
  kubeProxyMode: nftables
  podSubnet: 10.244.0.0/16
  serviceSubnet: 10.96.0.0/16
nodes:
- role: control-plane
kubeadmConfigPatches:
- |
  kind: InitConfiguration
  skipPhases: [preflight, addon/coredns]
- |
  kind: KubeletConfiguration
  failCgroupV1: false
EOF
}

stock_config() {
  local i workers=${KIND_WORKERS:-2}
  printf 'kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnetworking:\n  apiServerAddress: "127.0.0.1"\n'
  printf 'nodes:\n- role: control-plane\n'
  for ((i = 0; i < workers; i++)); do printf -- '- role: worker\n'; done
  if [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
    printf 'kubeadmConfigPatches:\n- |\n  kind: KubeletConfiguration\n  failCgroupV1: false\n'
  fi
}

node_kubectl() { # kubectl inside the control-plane node (no kubectl needed here)
  "$real_docker" exec -i "$name-control-plane" kubectl --kubeconfig=/etc/kubernetes/admin.conf "$@"
}

up() {
  bash "$root/scripts/docker.sh"
  [ -n "$real_docker" ] || die "no docker on PATH"
  mkdir -p "$cache/kind"
  local start=$SECONDS image offline=0
  if exists; then
    say "cluster $name exists; reusing it"
    local node
    for node in $(kind_ get nodes --name "$name"); do
      [ "$("$real_docker" inspect -f '{{.State.Running}}' "$node")" = true ] || run "$real_docker" start "$node"
    done
  else
    if [ -n "${KIND_NODE_IMAGE:-}" ]; then
      image=$KIND_NODE_IMAGE
    else
      image=$("$real_docker" images --format '{{.Repository}}:{{.Tag}}' kindest/node | grep -v '<none>' | head -n 1 || true)
    fi
    if [ -z "$image" ]; then
      offline=1
      image=$(bash "$root/scripts/kind/node.sh" 2>"$log" | tail -n 1) || { cat "$log" >&2; exit 1; }
      [ "${KIND_WORKERS:-0}" = 0 ] || say "KIND_WORKERS ignored: the offline node image makes one node"
    fi
    shim "$image"
    local create=$SECONDS
    say "creating cluster $name from $image"
    if [ "$offline" = 1 ]; then
      offline_config | kind_ create cluster --name "$name" --image "$image" --config - --wait 180s >"$log" 2>&1 ||
        { cat "$log" >&2; die "kind create cluster failed"; }
      local dns_ip coredns_image
      dns_ip=10.96.0.10
      coredns_image=$("$real_docker" exec "$name-control-plane" cat /kind/openforge/coredns-image)
      sed -e "s#@COREDNS_IMAGE@#$coredns_image#" -e "s#@DNS_IP@#$dns_ip#" "$root/scripts/kind/coredns.yaml" |
        run node_kubectl apply -f -
      if [ "${KIND_NETWORK_POLICY:-1}" = 1 ]; then
        local kube_router_image
        kube_router_image=$("$real_docker" exec "$name-control-plane" cat /kind/openforge/kube-router-image)
        sed -e "s#@KUBE_ROUTER_IMAGE@#$kube_router_image#" "$root/scripts/kind/network-policy.yaml" | run node_kubectl apply -f -
      fi
    else
      stock_config | kind_ create cluster --name "$name" --image "$image" --config - --wait 180s >"$log" 2>&1 ||
        { cat "$log" >&2; die "kind create cluster failed"; }
    fi
    say "cluster $name created in $((SECONDS - create)) s"
  fi
  local i
  for i in $(seq 1 180); do # a restarted node takes a while to serve again
    node_kubectl get --raw /readyz >/dev/null 2>&1 && break
    sleep 1
  done
  run node_kubectl wait --for=condition=Ready node --all --timeout=180s
  if node_kubectl -n kube-system get deploy coredns >/dev/null 2>&1; then
    run node_kubectl -n kube-system rollout status deploy/coredns --timeout=180s
  fi
  if node_kubectl -n kube-system get ds kube-router >/dev/null 2>&1; then
    run node_kubectl -n kube-system rollout status ds/kube-router --timeout=180s
  fi
  kind_ get kubeconfig --name "$name" >"$kubeconfig.tmp"
  mv "$kubeconfig.tmp" "$kubeconfig"
  local image_
  for image_ in ${KIND_LOAD_IMAGES:-}; do load_ "$image_"; done
  say "ready in $((SECONDS - start)) s; run the cluster tests with: KUBECONFIG=$kubeconfig python -m pytest -m cluster"
  echo "$kubeconfig"
}

clients() { # helm and kubectl: $HELM/$KUBECTL, else build_cluster_binaries.sh's, else PATH's
  local bins
  bins=$(bash "$root/scripts/build_cluster_binaries.sh" --check 2>/dev/null || true)
  helm=${HELM:-$(echo "$bins" | sed -n 's/^helm=//p')}
  kubectl=${KUBECTL:-$(echo "$bins" | sed -n 's/^kubectl=//p')}
  [ -n "$helm" ] || helm=helm
  [ -n "$kubectl" ] || kubectl=kubectl
}

node_image() { # <node> <image>: the image ID the node's containerd has under that name, if any
  "$real_docker" exec "$1" crictl inspecti -o go-template --template '{{.status.id}}' "$2" 2>/dev/null || true
}

load_() {
  local node node_ nodes image id changed="" before snapshotter
  nodes=$(kind_ get nodes --name "$name")
  node=$(echo "$nodes" | head -n 1)
  for image in "$@"; do
    id=$("$real_docker" image inspect -f '{{.Id}}' "$image" 2>/dev/null) || die "no image $image in Docker; build it first (scripts/images.sh)"
    before=$(node_image "$node" "$image")
    # Streamed into each node's containerd as kind's own load does it, without
    # kind's copy of the image in a temporary tar first: for the trainer that
    # copy was 7 GB more on the disk the node's containerd already fills. A node
    # that has this very image is skipped.
    for node_ in $nodes; do
      [ "$(node_image "$node_" "$image")" != "$id" ] || continue
      snapshotter=$("$real_docker" exec "$node_" sh -c \
        "containerd config dump 2>/dev/null | sed -n 's/^ *snapshotter = \"\\(.*\\)\"/\\1/p' | head -n 1")
      if ! "$real_docker" save "$image" | "$real_docker" exec -i "$node_" \
        ctr --namespace=k8s.io images import --all-platforms --digests "--snapshotter=${snapshotter:-overlayfs}" - >"$log" 2>&1; then
        cat "$log" >&2
        df -h "$("$real_docker" info -f '{{.DockerRootDir}}' 2>/dev/null || echo /)" >&2 || true
        die "loading $image into $node_ failed"
      fi
    done
    [ "$before" = "$id" ] || changed="$changed $image"
  done
  # An import also names the image import-<date>@<digest>, and the build a tag
  # replaced stays on as an untagged image: both keep each replaced build (a
  # trainer image is 7 GB, twice over: its layers and their unpacked snapshot)
  # on the node's disk. Tags are what pods use: drop the rest. (An untagged
  # image a running container still uses stays until that container goes.)
  for node_ in $nodes; do
    "$real_docker" exec "$node_" sh -c '
      ctr -n k8s.io images ls -q | grep "^import-" | xargs -r ctr -n k8s.io images rm >/dev/null 2>&1
      crictl images --no-trunc 2>/dev/null | awk "\$1 == \"<none>\" && \$2 == \"<none>\" { print \$3 }" |
        xargs -r crictl rmi >/dev/null 2>&1
      true'
  done
  [ -n "$changed" ] && restart_users $changed
  return 0
}

# Deployments keep running the image their pods started with, and a rebuilt
# image keeps its tag: restart those that use a replaced one.
restart_users() { # <image>...
  [ -f "$kubeconfig" ] || return 0
  clients
  local line deployment images image
  "$kubectl" --kubeconfig "$kubeconfig" get deployments -A -o \
    jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name} {.spec.template.spec.containers[*].image} {.spec.template.spec.initContainers[*].image}{"\n"}{end}' 2>/dev/null |
    while read -r deployment images; do
      for image in "$@"; do
        case " $images " in *" $image "*)
          say "restarting deployment $deployment (image $image replaced)"
          run "$kubectl" --kubeconfig "$kubeconfig" -n "${deployment%%/*}" rollout restart "deployment/${deployment#*/}"
          # A deployment that sat in ImagePullBackOff until this load (a chart installed
          # before its images) still says ProgressDeadlineExceeded when its restart is
          # first looked at: look again once its new pods had a chance.
          if ! "$kubectl" --kubeconfig "$kubeconfig" -n "${deployment%%/*}" rollout status "deployment/${deployment#*/}" --timeout=600s >&2; then
            sleep 10
            run "$kubectl" --kubeconfig "$kubeconfig" -n "${deployment%%/*}" rollout status "deployment/${deployment#*/}" --timeout=600s
          fi
          break ;;
        esac
      done
    done
}

case "${1:-}" in
  up) kind=$(kind_bin); up ;;
  load)
    shift
    [ $# -gt 0 ] || die "usage: kind-up.sh load IMAGE..."
    kind=$(kind_bin)
    exists || die "no cluster $name; run: $0 up"
    load_ "$@"
    ;;
  images)
    kind=$(kind_bin)
    exists || die "no cluster $name; run: $0 up"
    built=$(bash "$root/scripts/images.sh" "${2:-tier}") || die "scripts/images.sh failed"
    for image in $built; do
      case "$image" in openforge/debian:* | openforge/python:*) continue ;; esac
      load_ "$image"
      echo "$image"
    done
    ;;
  demo)
    [ -f "$kubeconfig" ] || die "no kubeconfig at $kubeconfig; run: $0 up"
    clients
    # a cluster made without NetworkPolicy enforcement would fence no pod: the
    # operator then starts harnesses without waiting for the fence
    unfenced=()
    [ "${KIND_NETWORK_POLICY:-1}" = 1 ] || unfenced=(--set operator.fenceWaitSeconds=0)
    "$helm" upgrade --install openforge "$root/charts/openforge" --kubeconfig "$kubeconfig" \
      --namespace openforge --create-namespace -f "$root/examples/cluster/helm/values.yaml" "${unfenced[@]}" --wait --timeout 10m >&2
    "$kubectl" --kubeconfig "$kubeconfig" create namespace rl --dry-run=client -o yaml |
      "$kubectl" --kubeconfig "$kubeconfig" apply -f - >&2
    "$kubectl" --kubeconfig "$kubeconfig" --namespace rl apply -f "$root/examples/cluster/" >&2
    say "watch it with: kubectl --kubeconfig $kubeconfig -n rl get rolloutjobs,pods"
    ;;
  demo-down)
    # what `demo` made: the RolloutJob namespace and the release (CRDs stay)
    [ -f "$kubeconfig" ] || die "no kubeconfig at $kubeconfig; run: $0 up"
    clients
    "$kubectl" --kubeconfig "$kubeconfig" delete namespace rl --ignore-not-found --wait=true >&2
    if "$helm" status openforge --kubeconfig "$kubeconfig" --namespace openforge >/dev/null 2>&1; then
      "$helm" uninstall openforge --kubeconfig "$kubeconfig" --namespace openforge --wait >&2
    fi
    "$kubectl" --kubeconfig "$kubeconfig" delete namespace openforge --ignore-not-found --wait=true >&2
    ;;
  down)
    kind=$(kind_bin)
    if exists; then run kind_ delete cluster --name "$name"; fi
    # kind's docker network, once no container uses it
    if [ -n "$real_docker" ] && "$real_docker" network inspect kind >/dev/null 2>&1 &&
       [ "$("$real_docker" network inspect -f '{{len .Containers}}' kind)" = 0 ]; then
      "$real_docker" network rm kind >/dev/null 2>&1 || true
    fi
    rm -rf "$rundir"
    rmdir "$cache/kind/run" 2>/dev/null || true
    rm -f "$kubeconfig"
    ;;
  kubeconfig)
    [ -f "$kubeconfig" ] || die "no kubeconfig at $kubeconfig; run: $0 up"
    echo "$kubeconfig"
    ;;
  *) die "usage: kind-up.sh up|load IMAGE...|images|demo|demo-down|kubeconfig|down" ;;
esac
