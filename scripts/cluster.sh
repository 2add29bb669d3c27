#!/usr/bin/env bash
# A real Kubernetes control plane on this machine, for tests: etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler and kwok (fake nodes
# whose pods are simulated by the Stage files in scripts/cluster/kwok-stages/).
# No containers run; every object goes through the real API server, admission,
# RBAC, the real controllers (garbage collector, Job, namespace, service
# account...) and the real scheduler. Everything listens on 127.0.0.1 only, on
# free ports picked at start.
#
# Usage:
#   cluster.sh up     [--dir DIR]   start; DIR/kubeconfig is the admin kubeconfig
#   cluster.sh down   [--dir DIR]   stop what `up` started (pids in DIR/run)
#   cluster.sh status [--dir DIR]   show each process and the API server's health
#
# DIR defaults to $OPENFORGE_CLUSTER_DIR or ${TMPDIR:-/tmp}/openforge-cluster.
# Binaries come from $OPENFORGE_CLUSTER_BIN (a folder holding etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok) or
# else from scripts/build_cluster_binaries.sh, which builds them when missing.
# OPENFORGE_KWOK_NODES sets the number of fake nodes (default 4, each with room
# for 10000 pods). See docs/cluster-testing.md.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
stages="$root/scripts/cluster/kwok-stages"
components=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

die() { echo "cluster.sh: $*" >&2; exit 1; }

cmd=${1:-}
[ $# -gt 0 ] && shift
dir=${OPENFORGE_CLUSTER_DIR:-${TMPDIR:-/tmp}/openforge-cluster}
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) [ $# -ge 2 ] || die "--dir needs a value"; dir=$2; shift 2 ;;
    --dir=*) dir=${1#--dir=}; shift ;;
    *) die "unknown argument: $1 (usage: cluster.sh up|down|status [--dir DIR])" ;;
  esac
done
case "$cmd" in up|down|status) ;; *) die "usage: cluster.sh up|down|status [--dir DIR]" ;; esac
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
run="$dir/run"
pki="$dir/pki"
logs="$dir/logs"

# --- processes -------------------------------------------------------------

# The pid recorded for a component, if that process is still the one we started.
live_pid() { # <name>
  local pid
  pid=$(cat "$run/$1.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$dir" || return 1
  echo "$pid"
}

start() { # <name> <binary> <args...>
  local name=$1; shift
  mkdir -p "$run" "$logs"
  setsid "$@" >"$logs/$name.log" 2>&1 </dev/null &
  echo $! >"$run/$name.pid"
}

any_alive() { # <pid...>
  local pid
  for pid in "$@"; do kill -0 "$pid" 2>/dev/null && return 0; done
  return 1
}

# SIGTERM to the given components at once, SIGKILL to any still running after 10 s.
stop() { # <name...>
  local name pid pids=() i
  for name in "$@"; do
    if pid=$(live_pid "$name"); then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
    rm -f "$run/$name.pid"
  done
  [ "${#pids[@]}" -gt 0 ] || return 0
  for i in $(seq 1 100); do
    any_alive "${pids[@]}" || return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

# Everything but etcd shuts down in parallel (1-3 s each); etcd goes last, as
# the API server's graceful shutdown stalls without it.
down() {
  stop kwok kube-scheduler kube-controller-manager kube-apiserver
  stop etcd
}

# Fail `up` with the end of the log of whatever did not come up.
fail_up() { # <message> <component>
  echo "cluster.sh: $1" >&2
  if [ -f "$logs/$2.log" ]; then
    echo "--- last lines of $logs/$2.log" >&2
    tail -n 40 "$logs/$2.log" >&2
  fi
  down
  exit 1
}

wait_until() { # <timeout s> <component> <description> <command...>
  local timeout=$1 name=$2 what=$3; shift 3
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    live_pid "$name" >/dev/null || fail_up "$name exited while waiting for $what" "$name"
    [ $SECONDS -lt $deadline ] || fail_up "timed out after ${timeout}s waiting for $what" "$name"
    sleep 0.2
  done
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# --- certificates ----------------------------------------------------------

# A client certificate signed by the cluster CA, and a kubeconfig that uses it.
client_kubeconfig() { # <file stem> <CN> <O or ""> <server>
  local stem=$1 cn=$2 org=$3 server=$4 subj
  subj="/CN=$cn"
  [ -n "$org" ] && subj="/O=$org$subj"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/$stem.key" -subj "$subj" -out "$pki/$stem.csr" 2>/dev/null
  openssl x509 -req -in "$pki/$stem.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 3650 \
    -extfile <(printf 'keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n') \
    -out "$pki/$stem.crt" 2>/dev/null
  cat >"$dir/$stem.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: openforge-test
  cluster:
    server: $server
    certificate-authority: $pki/ca.crt
users:
- name: $cn
  user:
    client-certificate: $pki/$stem.crt
    client-key: $pki/$stem.key
contexts:
- name: openforge-test
  context: {cluster: openforge-test, user: $cn}
current-context: openforge-test
EOF
}

make_pki() { # <server>
  mkdir -p "$pki"
  openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -subj "/CN=openforge-test-ca" \
    -days 3650 -out "$pki/ca.crt" 2>/dev/null
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/apiserver.key" -subj "/CN=kube-apiserver" \
    -out "$pki/apiserver.csr" 2>/dev/null
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 3650 \
    -extfile <(printf '%s\n' 'keyUsage=critical,digitalSignature,keyEncipherment' 'extendedKeyUsage=serverAuth' \
      'subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local') \
    -out "$pki/apiserver.crt" 2>/dev/null
  # Service-account token signing pair.
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$pki/sa.key" 2>/dev/null
  openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  # The admin is in system:masters (RBAC cannot restrict it); tests that check
  # RBAC impersonate a service account (kubectl --as=system:serviceaccount:NS:NAME).
  client_kubeconfig admin openforge-admin system:masters "$1"
  client_kubeconfig controller-manager system:kube-controller-manager "" "$1"
  client_kubeconfig scheduler system:kube-scheduler "" "$1"
  client_kubeconfig kwok kwok-controller system:masters "$1"
  cp "$dir/admin.kubeconfig" "$dir/kubeconfig"
}

# --- up --------------------------------------------------------------------

binaries() {
  if [ -n "${OPENFORGE_CLUSTER_BIN:-}" ]; then
    bin=$OPENFORGE_CLUSTER_BIN
  else
    bin=$(bash "$root/scripts/build_cluster_binaries.sh" | tail -n 1) || die "could not build the cluster binaries"
  fi
  local b
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok; do
    [ -x "$bin/$b" ] || die "missing binary $bin/$b"
  done
}

fake_nodes() { # <count>
  local i
  for ((i = 0; i < $1; i++)); do
    cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    type: kwok
    kubernetes.io/arch: amd64
    kubernetes.io/os: linux
    kubernetes.io/hostname: kwok-node-$i
    node-role.kubernetes.io/agent: ""
status:
  capacity: {cpu: "1000", memory: 4Ti, pods: "10000", ephemeral-storage: 10Ti}
  allocatable: {cpu: "1000", memory: 4Ti, pods: "10000", ephemeral-storage: 10Ti}
EOF
  done
}

up() {
  local pid name
  for name in "${components[@]}"; do
    if pid=$(live_pid "$name"); then die "$name is already running in $dir (pid $pid); run: cluster.sh down --dir $dir"; fi
  done
  binaries
  rm -rf "$dir/etcd" "$pki" "$run" "$logs"
  mkdir -p "$run" "$logs"
  local etcd_port peer_port api_port server
  etcd_port=$(free_port); peer_port=$(free_port); api_port=$(free_port)
  server="https://127.0.0.1:$api_port"
  make_pki "$server"
  local kubectl=("$bin/kubectl" --kubeconfig "$dir/kubeconfig")

  start etcd "$bin/etcd" --name openforge --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "openforge=http://127.0.0.1:$peer_port" \
    --unsafe-no-fsync --quota-backend-bytes 8589934592 --log-level warn
  wait_until 60 etcd "etcd health" curl -sf "http://127.0.0.1:$etcd_port/health"

  start kube-apiserver "$bin/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range 10.0.0.0/24 \
    --authorization-mode Node,RBAC \
    --allow-privileged=true \
    --profiling=false \
    --max-requests-inflight 1000 --max-mutating-requests-inflight 500 \
    --v 1
  wait_until 180 kube-apiserver "the API server to be ready" "${kubectl[@]}" get --raw /readyz

  start kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$dir/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$dir/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$dir/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 \
    --use-service-account-credentials=true \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
    --service-cluster-ip-range 10.0.0.0/24 \
    --kube-api-qps 500 --kube-api-burst 1000 \
    --concurrent-gc-syncs 50 --concurrent-job-syncs 50 \
    --leader-elect=false --profiling=false --v 1

  cat >"$dir/scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $dir/scheduler.kubeconfig
  qps: 500
  burst: 1000
leaderElection:
  leaderElect: false
EOF
  start kube-scheduler "$bin/kube-scheduler" --config "$dir/scheduler.yaml" \
    --authentication-kubeconfig "$dir/scheduler.kubeconfig" --authorization-kubeconfig "$dir/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --v 1

  local configs=() f
  for f in "$stages"/*.yaml; do configs+=(--config "$f"); done
  # HOME points into DIR so kwok reads no ~/.kwok/kwok.yaml of the user.
  mkdir -p "$dir/kwok-home"
  HOME="$dir/kwok-home" start kwok "$bin/kwok" --kubeconfig "$dir/kwok.kubeconfig" "${configs[@]}" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --node-lease-duration-seconds 40 --cidr 10.16.0.0/16 --node-ip 10.15.0.1

  fake_nodes "${OPENFORGE_KWOK_NODES:-4}" | "${kubectl[@]}" apply -f - >/dev/null
  wait_until 120 kwok "the fake nodes to be Ready" \
    "${kubectl[@]}" wait --for=condition=Ready node -l type=kwok --timeout=2s
  wait_until 120 kube-controller-manager "the default service account (service account controller)" \
    "${kubectl[@]}" -n default get serviceaccount default
  wait_until 120 kube-controller-manager "kube-root-ca.crt in default (root CA publisher)" \
    "${kubectl[@]}" -n default get configmap kube-root-ca.crt
  live_pid kube-scheduler >/dev/null || fail_up "kube-scheduler exited" kube-scheduler

  cat >"$dir/env" <<EOF
export KUBECONFIG=$dir/kubeconfig
export PATH=$bin:\$PATH
EOF
  echo "cluster.sh: up in $dir (API server $server; logs in $logs; '. $dir/env' to use it)" >&2
  echo "$dir/kubeconfig"
}

status() {
  local name pid rc=0
  for name in "${components[@]}"; do
    if pid=$(live_pid "$name"); then echo "$name: running (pid $pid)"; else echo "$name: stopped"; rc=1; fi
  done
  if [ -f "$dir/kubeconfig" ] && [ -f "$dir/env" ]; then
    local kubectl_bin
    kubectl_bin=$(sed -n 's|^export PATH=\(.*\):\$PATH$|\1|p' "$dir/env")/kubectl
    if "$kubectl_bin" --kubeconfig "$dir/kubeconfig" get --raw /readyz >/dev/null 2>&1; then
      echo "api server: ready ($(grep -m1 'server:' "$dir/kubeconfig" | awk '{print $2}'))"
    else
      echo "api server: not ready"; rc=1
    fi
  fi
  return $rc
}

case "$cmd" in
  up) up ;;
  down) down; echo "cluster.sh: down ($dir)" >&2 ;;
  status) status ;;
esac
