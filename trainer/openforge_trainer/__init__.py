"""OpenForge's trainer component: everything after a record leaves its sidecar.

One subpackage per subsystem: ``collection`` (collector, store),
``trajectories`` (export, display), ``analysis`` (behaviour metrics),
``training`` (``openforge train``), ``serving`` (``openforge serve``, weight
publishing), ``testengine`` (the deterministic engine) and ``tiny`` (the
offline tiny policy and its tokenizer, whose committed files are ``assets/``).
``cli`` is ``openforge collector`` and ``openforge trajectories``.
"""
