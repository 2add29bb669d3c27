"""scripts/install_zeroclaw.sh with stand-in ``cargo``/``rustc``: which toolchain it
builds with, that it pins the version, skips a finished install and fails clearly.

The real build (tens of minutes) is not run here; the conformance suite uses
the binary it leaves in ~/.cache/openforge/cargo when one is there.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install_zeroclaw.sh"

# cargo [+toolchain] install ... --root ROOT: log the call, leave a zeroclaw that
# reports the version asked for. rustc [+toolchain] --version: from the env.
CARGO = """#!/bin/sh
echo "cargo $*" >> "$CALLS"
echo "profile lto=${CARGO_PROFILE_RELEASE_LTO-} units=${CARGO_PROFILE_RELEASE_CODEGEN_UNITS-} \
opt=${CARGO_PROFILE_RELEASE_OPT_LEVEL-}" >> "$CALLS"
case "$*" in *--version) [ "$1" = install ] || { echo "cargo 1.0.0"; exit 0; } ;; esac
root=""; version=""
while [ $# -gt 0 ]; do
  case "$1" in --root) root="$2"; shift ;; --version) version="$2"; shift ;; esac
  shift
done
[ -n "$FAIL_BUILD" ] && { echo "error: could not compile" >&2; exit 101; }
mkdir -p "$root/bin"
printf '#!/bin/sh\\necho "zeroclaw %s"\\n' "$version" > "$root/bin/zeroclaw"
chmod +x "$root/bin/zeroclaw"
"""
RUSTC = """#!/bin/sh
if [ "$1" = "+nightly" ]; then echo "rustc $NIGHTLY_RUSTC (nightly)"; \
else echo "rustc $DEFAULT_RUSTC (stable)"; fi
"""


def setup(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in [("cargo", CARGO), ("rustc", RUSTC), ("rustup", "#!/bin/sh\n")]:
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "OPENFORGE_CARGO_ROOT": str(tmp_path / "cargo-root"),
        "CALLS": str(tmp_path / "calls"),
        "DEFAULT_RUSTC": "1.95.0",
        "NIGHTLY_RUSTC": "1.97.0-nightly",
    }


def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30, check=False
    )


def calls(env: dict[str, str]) -> list[str]:
    path = Path(env["CALLS"])
    return (
        [line for line in path.read_text().splitlines() if " install " in f" {line} "]
        if path.exists()
        else []
    )


def test_an_old_default_toolchain_builds_with_nightly_at_the_pinned_version(tmp_path: Path) -> None:
    env = setup(tmp_path)
    done = run(env)
    assert done.returncode == 0, done.stderr
    binary = Path(env["OPENFORGE_CARGO_ROOT"]) / "bin" / "zeroclaw"
    assert done.stdout.strip().splitlines()[-1] == f"ZEROCLAW_BIN={binary}"
    [call] = calls(env)
    assert call.startswith("cargo +nightly install zeroclaw --version 0.8.7 --locked --root ")
    assert call.endswith("-j 1")


def test_a_new_enough_default_toolchain_is_used_as_it_is(tmp_path: Path) -> None:
    env = {**setup(tmp_path), "DEFAULT_RUSTC": "1.96.1", "OPENFORGE_CARGO_JOBS": "2"}
    assert run(env).returncode == 0
    [call] = calls(env)
    assert call.startswith("cargo install zeroclaw --version 0.8.7") and call.endswith("-j 2")


def test_an_installed_pinned_version_is_not_built_again(tmp_path: Path) -> None:
    env = setup(tmp_path)
    assert run(env).returncode == 0
    again = run(env)
    assert again.returncode == 0 and "already installed" in again.stderr
    assert len(calls(env)) == 1


def test_no_toolchain_new_enough_fails_naming_what_to_do(tmp_path: Path) -> None:
    env = {**setup(tmp_path), "NIGHTLY_RUSTC": "1.90.0-nightly"}
    done = run(env)
    assert done.returncode == 1 and calls(env) == []
    assert "needs rustc >= 1.96.0" in done.stderr and "ZEROCLAW_TOOLCHAIN" in done.stderr


def test_a_failed_build_fails(tmp_path: Path) -> None:
    env = {**setup(tmp_path), "FAIL_BUILD": "1"}
    done = run(env)
    assert done.returncode == 1 and "cargo install zeroclaw@0.8.7 failed" in done.stderr
    assert not (Path(env["OPENFORGE_CARGO_ROOT"]) / "bin" / "zeroclaw").exists()
    assert "ZEROCLAW_BIN" not in done.stdout
    assert os.access(SCRIPT, os.X_OK)


def profile(env: dict[str, str]) -> list[str]:
    return [
        line for line in Path(env["CALLS"]).read_text().splitlines() if line.startswith("profile ")
    ]


def test_the_build_overrides_the_crates_slow_release_profile_unless_told_not_to(
    tmp_path: Path,
) -> None:
    env = setup(tmp_path)
    assert run(env).returncode == 0
    assert profile(env)[-1] == "profile lto=false units=16 opt=0"
    (tmp_path / "upstream").mkdir()
    upstream = {**setup(tmp_path / "upstream"), "ZEROCLAW_PROFILE": "upstream"}
    assert run(upstream).returncode == 0
    assert profile(upstream)[-1] == "profile lto= units= opt="
