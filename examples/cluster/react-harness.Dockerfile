# The demo harness image, ghcr.io/openforge/react-harness: the built-in ReAct
# agent (examples/harnesses/react, needs only the openai client) and the toy
# tool-calling tasks with their prepare and grade scripts. Build from the
# repository root:
#
#   docker build -f examples/cluster/react-harness.Dockerfile -t ghcr.io/openforge/react-harness:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}
COPY constraints.txt /tmp/constraints.txt
RUN pip install --no-cache-dir -c /tmp/constraints.txt openai && rm /tmp/constraints.txt
COPY examples/harnesses/react/ /opt/openforge/harnesses/react/
COPY examples/tasks/toy-tools/ /opt/openforge/tasks/toy-tools/
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# The operator's default run-as user for a harness that sets none.
USER 1000:1000
WORKDIR /work
