"""Tests that need the development data, run without it: listed by name at the end of the
run with where the data was looked for and how to point at it, not only an "s"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tests_skipped_without_the_dev_data_are_listed_with_the_fix(tmp_path: Path) -> None:
    nowhere = tmp_path / "nowhere"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-k", "real_outputs",
         "tests/test_suffix_array.py"],
        cwd=ROOT, env={**os.environ, "SSSD_DATA": str(nowhere)}, capture_output=True,
        text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    section = out[out.index("development data not found") :]
    listed = [line for line in section.splitlines() if line.startswith("SKIPPED ")]
    assert sorted(line.split(": ")[0] for line in listed) == [
        "SKIPPED tests/test_suffix_array.py::test_find_range_on_real_outputs",
        "SKIPPED tests/test_suffix_array.py::test_suffix_array_on_real_outputs",
    ], section
    assert all(f"{nowhere}/dev/code_humaneval_llama31_8b.jsonl.gz" in line for line in listed)
    assert "set SSSD_DATA=DIR (or run make test DATA=DIR)" in section
