# The Python base the project's images build on where no registry is reachable:
# Debian bookworm's own Python 3.11 on the locally built Debian base
# (scripts/images.sh base), shaped like python:3.11-slim-bookworm where the
# Dockerfiles rely on it: `python` and `pip` on PATH, pip allowed to install
# into the system Python. Built by scripts/images.sh as openforge/python:3.11-bookworm;
# every project Dockerfile takes it through its PYTHON_IMAGE argument.
#
# trust.crt is the building machine's CA bundle (scripts/images.sh copies it
# in): behind a TLS-inspecting proxy, pip and npm inside `docker build` must
# trust what the machine trusts. It replaces the image's bundle, and the usual
# variables point pip, requests, Node and OpenSSL at it.
ARG BASE_IMAGE=openforge/debian:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv python3-pip python-is-python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* /usr/lib/python3.11/EXTERNALLY-MANAGED
COPY trust.crt /etc/ssl/certs/ca-certificates.crt
ENV LANG=C.UTF-8 \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1
