"""The committed gRPC stubs (sssd_drafter/) are exactly what proto/ generates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
PROTO = "sssd_drafter/v1/drafter.proto"
GENERATED = ("drafter_pb2.py", "drafter_pb2.pyi", "drafter_pb2_grpc.py", "drafter_pb2_grpc.pyi")
PLUGIN = Path(sys.executable).parent / "protoc-gen-mypy_grpc"


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'proto'}",
         f"--python_out={tmp_path}", f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}",
         f"--plugin=protoc-gen-mypy_grpc={PLUGIN}", f"--mypy_grpc_out={tmp_path}",
         str(ROOT / "proto" / PROTO)],
        check=True,
    )  # fmt: skip
    for name in GENERATED:
        fresh = (tmp_path / "sssd_drafter/v1" / name).read_text()
        committed = (ROOT / "sssd_drafter/v1" / name).read_text()
        assert fresh == committed, f"sssd_drafter/v1/{name} is stale: run `make proto`"


def test_enums_start_with_unspecified_zero() -> None:
    from sssd_drafter.v1 import drafter_pb2

    for enum in drafter_pb2.DESCRIPTOR.enum_types_by_name.values():
        zero = enum.values_by_number[0].name
        assert zero.endswith("_UNSPECIFIED"), f"{enum.name}: value 0 is {zero}"
