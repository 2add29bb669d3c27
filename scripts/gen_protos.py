"""Regenerate the committed Python code (in common/) for proto/openforge/**/*.proto.

Run with the pinned grpcio-tools (see pyproject's `test` extra):
    python scripts/gen_protos.py [OUT_DIR]
Compiling with `-I proto` makes generated imports package imports
(`from openforge.trajectory.v1 import trajectory_pb2`), which is what lets
the generated gRPC module import its messages once installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE_ROOT = ROOT / "common"
PINNED_GRPCIO_TOOLS = "1.85.1"


def generate(out_dir: Path) -> list[Path]:
    import grpc_tools

    version = getattr(grpc_tools, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("grpcio-tools")
    if version != PINNED_GRPCIO_TOOLS:
        raise SystemExit(f"grpcio-tools {version} found, {PINNED_GRPCIO_TOOLS} pinned")
    sources = sorted(PROTO_ROOT.glob("openforge/**/*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    for source in sources:
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(source.relative_to(PROTO_ROOT)),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {source}")
    return sources


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE_ROOT)
