"""OpenForge's shared contract.

This package holds what every component agrees on and nothing else: the
trajectory wire contract generated from ``proto/`` (``openforge.trajectory.v1``)
and the ``openforge`` command, which dispatches to the components
(``openforge_sidecar``, ``openforge_trainer``, ...) lazily so that none of
them is imported unless its subcommand runs.
"""
