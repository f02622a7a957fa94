"""Where the development data is (model outputs and the corpus of ../shared/data), and a
loud account of the tests that ran without it.

``SSSD_DATA`` names the directory (``make test DATA=DIR`` sets it); unset, it is
``../shared/data`` beside the repository. A test that needs a file calls :func:`need`:
the file's path, or a skip whose reason says where it looked and how to point there.
Every such skip, and every test that ran on a stand-in instead (:func:`note_stand_in`),
is listed in a section of its own at the end of the run (tests/conftest.py), not only
as an "s" in the progress line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

BESIDE = Path(__file__).resolve().parents[2] / "shared" / "data"
DATA_DIR = Path(os.environ.get("SSSD_DATA") or BESIDE)
HUMANEVAL = DATA_DIR / "dev" / "code_humaneval_llama31_8b.jsonl.gz"
CORPUS_IDS = DATA_DIR / "corpus" / "datastore_llama3_family.jsonl.gz"
CORPUS_TEXT = DATA_DIR / "corpus" / "datastore_llama3_family.text.jsonl.gz"

HOW = (
    "set SSSD_DATA=DIR (or run make test DATA=DIR) to the development data directory, "
    "which holds dev/ and corpus/ (README, 'Development data')"
)
SKIP_PREFIX = "dev data not found:"

# Tests that ran on a stand-in for missing data: which test, and what it used instead.
stand_ins: list[str] = []


def need(*paths: Path) -> Path:
    """The first of ``paths`` once all exist; otherwise skips the test, naming the missing
    file and how to point at the data."""
    for path in paths:
        if not path.is_file():
            pytest.skip(f"{SKIP_PREFIX} {path}; {HOW}")
    return paths[0]


def note_stand_in(what: str) -> None:
    """Records that a test used ``what`` in place of missing development data."""
    stand_ins.append(what)
