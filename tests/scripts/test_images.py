"""scripts/images.sh: a build the disk cannot hold is refused up front, naming the image,
the folder and the space, instead of failing mid-layer with "no space left on device".

Real Docker (``scripts/test.sh`` starts it, and images.sh starts it itself) and a real
full disk: a 1 MiB tmpfs stands in for Docker's root folder, which a wrapper around the
real ``docker`` reports; every other command goes to Docker unchanged.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "scripts" / "images.sh"


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "docker-root"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_a_build_the_disk_cannot_hold_is_refused_with_the_space_it_needs(
    tmp_path: Path, full_disk: Path
) -> None:
    docker = shutil.which("docker")
    assert docker, "Docker is installed by scripts/docker.sh, which scripts/test.sh runs first"
    wrapper = tmp_path / "docker"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = info ]; then echo {full_disk}; exit 0; fi\n'
        f'exec {docker} "$@"\n'
    )  # fmt: skip
    wrapper.chmod(0o755)
    done = subprocess.run(
        ["bash", str(IMAGES), "operator"], capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "DOCKER": str(wrapper)},
    )  # fmt: skip
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "images.sh: building ghcr.io/openforge/operator:0.1.0 needs about" in done.stderr
    assert f"GiB free in {full_disk}; it has 0 GiB" in done.stderr
    assert "docker image prune" in done.stderr  # and what to do about it
    assert "ghcr.io/openforge/operator" not in done.stdout  # nothing was built


def _build(tmp_path: Path, *, tag: str, label: str, marker: str) -> str:
    """A tiny image (a label, one file) tagged ``tag``; its id."""
    context = tmp_path / marker
    context.mkdir()
    (context / "marker").write_text(marker)
    (context / "Dockerfile").write_text("FROM openforge/debian:bookworm\nCOPY marker /marker\n")
    subprocess.run(
        ["docker", "build", "-q", "--label", label, "-t", tag, str(context)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    inspected = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Id}}", tag],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return inspected.stdout.strip()


def _exists(image: str) -> bool:
    return (
        subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0
    )


def test_a_replaced_dependency_stage_is_pruned_and_the_current_one_kept(tmp_path: Path) -> None:
    """A dependency stage that a new build replaced under its tag is left untagged: images.sh
    prunes it (the trainer's is 7 GB, and a CI machine's disk filled with them), and keeps
    the tagged one, which is the layer cache of the next build."""
    subprocess.run(["bash", str(IMAGES), "base"], check=True, capture_output=True, timeout=1800)
    tag = "openforge/deps-prune-test:0"
    try:
        old = _build(tmp_path, tag=tag, label="dev.openforge.deps=old", marker="old")
        new = _build(tmp_path, tag=tag, label="dev.openforge.deps=new", marker="new")
        assert old != new and _exists(old)
        done = subprocess.run(
            ["bash", str(IMAGES), "base"], capture_output=True, text=True, timeout=1800
        )
        assert done.returncode == 0, done.stderr
        assert not _exists(old), "the replaced dependency stage was kept"
        assert _exists(new) and _exists(tag)
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
