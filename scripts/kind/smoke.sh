#!/usr/bin/env bash
# Check a cluster made by `scripts/kind-up.sh up` with real pods (docs/kind.md):
# node Ready, CoreDNS Running, a pod from openforge/python:3.11-bookworm runs
# `python -c`, resolves kubernetes.default and another pod's Service and
# fetches from it, cannot resolve outside names nor connect to a listener this
# script opens on the host's side of kind's Docker network (which the node
# itself reaches: so the pod's refusal is the node's egress fence, and no
# address off this machine is ever tried), and a deny-all NetworkPolicy blocks
# the pod-to-pod connection that worked without it (and works again once the
# policy is deleted). Deletes its namespace.
#
# Environment: KUBECONFIG (default: scripts/kind-up.sh kubeconfig), KUBECTL
# (default: the one of scripts/build_cluster_binaries.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export KUBECONFIG=${KUBECONFIG:-$("$root/scripts/kind-up.sh" kubeconfig)}
kubectl=${KUBECTL:-$(bash "$root/scripts/build_cluster_binaries.sh" --check 2>/dev/null | sed -n 's/^kubectl=//p')}
ns=kind-smoke
image=openforge/python:3.11-bookworm
k() { "$kubectl" "$@"; }
fail() { echo "smoke: FAIL: $*" >&2; exit 1; }
ok() { echo "smoke: ok: $*"; }

k wait --for=condition=Ready node --all --timeout=60s >/dev/null || fail "node not Ready"
ok "nodes Ready: $(k get nodes --no-headers | awk '{print $1}' | paste -sd' ' -)"
k -n kube-system wait --for=condition=Ready pod -l k8s-app=kube-dns --timeout=60s >/dev/null || fail "CoreDNS not Ready"
ok "CoreDNS Running"
"$root/scripts/kind-up.sh" load "$image" >/dev/null

k delete namespace "$ns" --ignore-not-found --wait >/dev/null
trap 'k delete namespace "$ns" --ignore-not-found --wait=false >/dev/null' EXIT
k create namespace "$ns" >/dev/null
k -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  containers:
  - name: web
    image: $image
    imagePullPolicy: Never
    command: [python, -m, http.server, "8080"]
    readinessProbe: {tcpSocket: {port: 8080}}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
EOF
k -n "$ns" wait pod/web --for=condition=Ready --timeout=120s >/dev/null || fail "pod web not Ready"
web_ip=$(k -n "$ns" get pod web -o jsonpath='{.status.podIP}')

# "outside": a listener on this machine, at the host's address on kind's network
gateway=$(docker network inspect kind -f '{{range .IPAM.Config}}{{.Gateway}} {{end}}' | tr ' ' '\n' | grep -m1 '\.')
[ -n "$gateway" ] || fail "no IPv4 gateway on docker network kind"
outside_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server --bind "$gateway" "$outside_port" >/dev/null 2>&1 &
listener=$!
trap 'kill $listener 2>/dev/null; k delete namespace "$ns" --ignore-not-found --wait=false >/dev/null' EXIT
for _ in $(seq 1 50); do docker exec "${KIND_CLUSTER:-openforge}-control-plane" bash -c "exec 3<>/dev/tcp/$gateway/$outside_port" 2>/dev/null && break; sleep 0.1; done ||
  true
docker exec "${KIND_CLUSTER:-openforge}-control-plane" bash -c "exec 3<>/dev/tcp/$gateway/$outside_port" 2>/dev/null ||
  fail "the node cannot reach the host's listener $gateway:$outside_port (the pod check below would prove nothing)"
ok "the node reaches the host's listener $gateway:$outside_port"

client() { # <name> <python code>; prints the pod's output
  k -n "$ns" run "$1" --image="$image" --image-pull-policy=Never --restart=Never --command -- python -c "$2" >/dev/null
  k -n "$ns" wait "pod/$1" --for=jsonpath='{.status.phase}'=Succeeded --timeout=90s >/dev/null ||
    { k -n "$ns" logs "$1" >&2 || true; fail "pod $1 did not succeed"; }
  k -n "$ns" logs "$1"
}

out=$(client client "
import socket, sys, urllib.request
print('python', sys.version.split()[0])
print('kubernetes.default', socket.gethostbyname('kubernetes.default.svc.cluster.local'))
body = urllib.request.urlopen('http://web.$ns.svc.cluster.local/', timeout=5).read()
print('service-get', len(body))
try:
    socket.getaddrinfo('example.org', 80); print('outside-name resolved')
except OSError:
    print('outside-name unresolved')
s = socket.socket(); s.settimeout(3)
try:
    s.connect(('$gateway', $outside_port)); print('outside-connect connected')
except OSError as e:
    print('outside-connect blocked', type(e).__name__)
")
echo "$out" | sed 's/^/smoke:   /'
echo "$out" | grep -q '^kubernetes.default 10\.' || fail "kubernetes.default did not resolve"
echo "$out" | grep -q '^service-get [1-9]' || fail "the Service of pod web did not answer"
echo "$out" | grep -q '^outside-name unresolved' || fail "an outside name resolved"
echo "$out" | grep -q '^outside-connect blocked' || fail "the host's listener $gateway:$outside_port was reachable from a pod"
ok "python pod: cluster DNS, Service of another pod, no way out"

probe='
import socket, sys
s = socket.socket(); s.settimeout(3)
try:
    s.connect((sys.argv[1], 8080)); print("connected")
except OSError as e:
    print("blocked", type(e).__name__)
'
probe_pod() { client "$1" "import sys; sys.argv = ['', '$web_ip']; $probe"; }
[ "$(probe_pod probe-open)" = connected ] || fail "pod-to-pod connection failed without a policy"
ok "pod-to-pod connection without a policy"
if k -n kube-system get ds kube-router >/dev/null 2>&1; then
  k -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
EOF
  sleep 2
  result=$(probe_pod probe-denied)
  [[ $result == blocked* ]] || fail "deny-all NetworkPolicy did not block the pod-to-pod connection ($result)"
  ok "deny-all NetworkPolicy blocks it ($result)"
  k -n "$ns" delete networkpolicy deny-all >/dev/null
  sleep 2
  [ "$(probe_pod probe-reopened)" = connected ] || fail "pod-to-pod connection still blocked after deleting the policy"
  ok "connection works again once the policy is deleted"
else
  echo "smoke: skipped: NetworkPolicy (no kube-router DaemonSet)"
fi
