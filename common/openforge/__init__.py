"""OpenForge's shared package: what more than one component must agree on.

- ``openforge.trajectory``: the trajectory contract generated from the IDL in
  the repository's ``proto/`` (records, the collector's gRPC service) and its
  per-job token auth;
- ``openforge.wire``: the wire APIs harnesses speak, one codec each, and the
  canonical conversation they map to;
- ``openforge.api``: the ``RolloutJob``/``HarnessEnv`` models, the CRDs made
  from them, and the rules both runners follow (tasks, attempts, the
  harness's environment, the verdict, grading);
- ``openforge.endpoints``: the HTTP paths and headers the components serve
  each other; ``openforge.control``: the token of a sidecar's control endpoint;
- ``openforge_runner``: ``openforge run``, the one-machine runner;
- ``openforge.cli``: the ``openforge`` command, which imports a component
  (``openforge_sidecar``, ``openforge_trainer``, ``openforge_operator``) only
  when its subcommand runs.

Nothing here imports a component (an import-linter contract holds it).
"""
