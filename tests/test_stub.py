"""The committed type stub of the native module matches what the build exports."""

from __future__ import annotations

from pathlib import Path

from nanobind.stubgen import StubGen

import drafter_service.native._core as core

STUB = Path(__file__).parents[1] / "drafter_service" / "native" / "_core.pyi"


def test_committed_stub_matches_native_module() -> None:
    gen = StubGen(core)
    gen.put(core)
    assert gen.get() == STUB.read_text(), (
        "drafter_service/native/_core.pyi is stale: run `make stubs` and commit the result"
    )
