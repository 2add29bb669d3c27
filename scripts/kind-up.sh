#!/usr/bin/env bash
# A kind cluster (Kubernetes in Docker) for running the cluster tests against
# real kubelets and containers, on a machine that has Docker or Podman:
#
#   scripts/kind-up.sh up      create the cluster, write its kubeconfig
#   scripts/kind-up.sh images  build the OpenForge images from this checkout and load them
#   scripts/kind-up.sh demo    helm-install the chart and apply examples/cluster (docs/cluster.md)
#   scripts/kind-up.sh down    delete it
#   KUBECONFIG=$(scripts/kind-up.sh kubeconfig) python -m pytest -m cluster
#
# Environment: KIND (the kind binary; default `kind` on PATH), KIND_CLUSTER
# (name, default openforge), KIND_NODE_IMAGE (e.g. kindest/node:v1.36.x; default
# is the image of the installed kind release), KIND_WORKERS (default 2),
# KIND_LOAD_IMAGES (space-separated local images to load into the nodes, e.g.
# the operator and sidecar images built from this checkout), DOCKER (the image
# builder for `images`; default `docker`), HELM and KUBECTL (for `demo`;
# default `helm` and `kubectl` on PATH).
# `images` builds ghcr.io/openforge/{operator,sidecar,trainer,react-harness}
# tagged with the chart's appVersion, the tags the chart and examples use.
# The kubeconfig goes to ${OPENFORGE_CACHE:-~/.cache/openforge}/kind/<name>.kubeconfig.
# Not run in this repository's CI (no Docker there); see docs/cluster-testing.md.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
kind=${KIND:-kind}
name=${KIND_CLUSTER:-openforge}
workers=${KIND_WORKERS:-2}
kubeconfig="${OPENFORGE_CACHE:-$HOME/.cache/openforge}/kind/$name.kubeconfig"

die() { echo "kind-up.sh: $*" >&2; exit 1; }
command -v "$kind" >/dev/null || die "no '$kind' on PATH (install kind: https://kind.sigs.k8s.io/docs/user/quick-start/)"

config() {
  printf 'kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnetworking:\n  apiServerAddress: "127.0.0.1"\nnodes:\n- role: control-plane\n'
  local i
  for ((i = 0; i < workers; i++)); do printf -- '- role: worker\n'; done
}

case "${1:-}" in
  up)
    mkdir -p "$(dirname "$kubeconfig")"
    if "$kind" get clusters 2>/dev/null | grep -qx "$name"; then
      echo "kind-up.sh: cluster $name exists; reusing it" >&2
    else
      image_args=()
      [ -n "${KIND_NODE_IMAGE:-}" ] && image_args=(--image "$KIND_NODE_IMAGE")
      config | "$kind" create cluster --name "$name" "${image_args[@]}" --config - --wait 180s >&2
    fi
    "$kind" get kubeconfig --name "$name" >"$kubeconfig"
    for image in ${KIND_LOAD_IMAGES:-}; do "$kind" load docker-image --name "$name" "$image" >&2; done
    echo "kind-up.sh: run the cluster tests with: KUBECONFIG=$kubeconfig python -m pytest -m cluster" >&2
    echo "$kubeconfig"
    ;;
  images)
    docker=${DOCKER:-docker}
    command -v "$docker" >/dev/null || die "no '$docker' on PATH (set DOCKER to the image builder)"
    version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$root/charts/openforge/Chart.yaml")
    [ -n "$version" ] || die "no appVersion in charts/openforge/Chart.yaml"
    for build in operator=operator/Dockerfile sidecar=sidecar/Dockerfile trainer=trainer/Dockerfile \
                 react-harness=examples/cluster/react-harness.Dockerfile; do
      image="ghcr.io/openforge/${build%%=*}:$version"
      dockerfile="$root/${build#*=}"
      [ -f "$dockerfile" ] || die "${build#*=} is missing"
      "$docker" build -f "$dockerfile" -t "$image" "$root" >&2
      "$kind" load docker-image --name "$name" "$image" >&2
    done
    ;;
  demo)
    [ -f "$kubeconfig" ] || die "no kubeconfig at $kubeconfig; run: $0 up"
    helm=${HELM:-helm}
    kubectl=${KUBECTL:-kubectl}
    "$helm" upgrade --install openforge "$root/charts/openforge" --kubeconfig "$kubeconfig" \
      --namespace openforge --create-namespace -f "$root/examples/cluster/helm/values.yaml" --wait --timeout 10m >&2
    "$kubectl" --kubeconfig "$kubeconfig" create namespace rl --dry-run=client -o yaml |
      "$kubectl" --kubeconfig "$kubeconfig" apply -f - >&2
    "$kubectl" --kubeconfig "$kubeconfig" --namespace rl apply -f "$root/examples/cluster/" >&2
    echo "kind-up.sh: watch it with: kubectl --kubeconfig $kubeconfig -n rl get rolloutjobs,pods" >&2
    ;;
  down)
    "$kind" delete cluster --name "$name" >&2
    rm -f "$kubeconfig"
    ;;
  kubeconfig)
    [ -f "$kubeconfig" ] || die "no kubeconfig at $kubeconfig; run: $0 up"
    echo "$kubeconfig"
    ;;
  *) die "usage: kind-up.sh up|images|demo|down|kubeconfig" ;;
esac
