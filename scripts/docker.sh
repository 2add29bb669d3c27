#!/usr/bin/env bash
# Make sure a Docker engine answers: install docker.io from apt when there is no
# dockerd, start dockerd when none runs (its log in $OPENFORGE_CACHE/docker/dockerd.log),
# and wait until `docker info` answers. Idempotent; prints nothing on success.
# On a machine whose Docker is managed otherwise (Docker Desktop, systemd) it
# only checks that `docker info` answers.
set -euo pipefail
cache=${OPENFORGE_CACHE:-$HOME/.cache/openforge}
docker=${DOCKER:-docker}
if "$docker" info >/dev/null 2>&1; then exit 0; fi
if ! command -v dockerd >/dev/null; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "docker.sh: no Docker engine answers and dockerd is not installed; install Docker" >&2
    exit 1
  fi
  log=$(mktemp)
  if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io; } >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"; echo "docker.sh: apt-get install docker.io failed" >&2; exit 1
  fi
  rm -f "$log"
fi
command -v "$docker" >/dev/null || { echo "docker.sh: dockerd is installed but no '$docker' client" >&2; exit 1; }
start() {
  [ "$(id -u)" = 0 ] || { echo "docker.sh: dockerd is not running and only root can start it here" >&2; exit 1; }
  mkdir -p "$cache/docker"
  setsid dockerd >>"$cache/docker/dockerd.log" 2>&1 < /dev/null &
}
# A dockerd that is still shutting down (or died) is replaced once it is gone.
for _ in $(seq 1 90); do
  "$docker" info >/dev/null 2>&1 && exit 0
  pgrep -x dockerd >/dev/null || start
  sleep 1
done
echo "docker.sh: dockerd did not answer within 90 s; its log:" >&2
tail -n 50 "$cache/docker/dockerd.log" >&2 2>/dev/null || true
exit 1
