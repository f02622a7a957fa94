"""Builder throughput and exact equality with the reference token ids, on the whole corpus.

Runs ``datastore-builder build`` on the text corpus (once storing outputs only,
once prompt + output), loads each snapshot and compares its text with the ids
file's ``output_ids`` (resp. ``prompt_ids + output_ids``) joined by separators.
Prints one JSON object per run: tokens, seconds, tokens/s, mismatched documents.

    python drafter_bench/builder_equality.py --data-dir ../shared/data \\
        --tokenizer path/tokenizer.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from datastore_builder.builder_cli import main as build
from drafter_bench.token_records import iter_records
from drafter_service.snapshot.store import load_snapshot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True)
    args = parser.parse_args()
    corpus = args.data_dir / "corpus"
    reference = list(iter_records(corpus / "datastore_llama3_family.jsonl.gz",
                                  vocab_size=1 << 30))
    for store in ("output", "prompt+output"):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "snapshot"
            start = time.perf_counter()
            code = build(["build", "--input", str(corpus / "datastore_llama3_family.text.jsonl.gz"),
                          "--prompt-field", "prompt_text", "--output-field", "output_text",
                          "--store", store, "--tokenizer", str(args.tokenizer),
                          "--output", str(out), "--quiet"])
            seconds = time.perf_counter() - start
            if code != 0:
                raise SystemExit(f"datastore-builder exited with {code}")
            datastore, _ = load_snapshot(out)
            text = np.concatenate([s.tokens() for s in datastore.sub_indices])
            docs = np.split(text, np.flatnonzero(text == -1))
            built = [d[d >= 0] for d in docs]
            want = [np.concatenate([r.prompt_ids, r.output_ids]) if store != "output"
                    else r.output_ids for r in reference]
            want = [w for w in want if len(w)]  # the builder skips empty documents
            mismatched = sum(1 for a, b in zip(built, want, strict=False)
                             if not np.array_equal(a, b))
            tokens = int(np.count_nonzero(text >= 0))
            print(json.dumps({
                "store": store, "documents": len(built), "reference_documents": len(want),
                "tokens": tokens, "seconds": round(seconds, 2),
                "tokens_per_s": round(tokens / seconds), "mismatched_documents": mismatched,
            }), flush=True)


if __name__ == "__main__":
    main()
