"""The tiny policy tokenizer the sidecar tests render with, named in one place.

It is the trainer's committed asset (the folder the suite's ``tiny_tokenizer_dir``
fixture gives too); the tests read it as files, as a sidecar reads a policy's
tokenizer, and import nothing of the trainer.
"""

from __future__ import annotations

import functools
from pathlib import Path

from openforge_sidecar.policy import template

DIR = (
    Path(__file__).resolve().parents[2]
    / "trainer"
    / "openforge_trainer"
    / "assets"
    / "tiny-tokenizer"
)


@functools.cache
def load() -> template.PolicyTokenizer:
    """The tiny policy's tokenizer, loaded once per test process."""
    return template.PolicyTokenizer.load(str(DIR))
