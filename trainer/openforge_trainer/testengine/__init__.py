"""The deterministic test engine: ``openforge test-engine`` (``engine``), its scripted chat
behaviour (``chat``), its tiny-policy mode (``policy``) and the GUI agent's scripted actions
(``gui``)."""
