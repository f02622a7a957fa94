"""Suffix-array build time and resident bytes per token at growing sub-index sizes.

Resident bytes are measured (VmRSS after the build, the input text freed), not
only accounted.

The real 6.4M-token corpus is built as is; larger texts tile it, each copy with
its token ids remapped by a fresh random permutation of the vocabulary, so the
copies do not repeat each other. Prints one JSON object per size.

    python drafter_bench/sa_build.py \\
        --corpus ../shared/data/corpus/datastore_llama3_family.jsonl.gz --sizes 6.4e6 64e6 256e6
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np

from drafter_bench.token_records import iter_documents
from drafter_service import SubIndex
from drafter_service.datastore.sub_indices import concat_documents

VOCAB = 128256


def tiled_text(base: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    parts = [base]
    total = len(base)
    while total < size:
        perm = rng.permutation(VOCAB).astype(np.int32)
        copy = np.where(base >= 0, perm[np.maximum(base, 0)], base).astype(np.int32)
        parts.append(copy)
        total += len(copy)
    return np.concatenate(parts)[:size]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--sizes", type=float, nargs="+", default=[6.4e6])
    args = parser.parse_args()
    base = concat_documents(iter_documents(args.corpus), VOCAB)
    rng = np.random.default_rng(0)
    for size in args.sizes:
        text = base if int(size) <= len(base) else tiled_text(base, int(size), rng)
        text_bytes = text.nbytes
        rss_before = _rss_bytes()
        start = time.perf_counter()
        index = SubIndex.from_text(text, VOCAB)
        build_s = time.perf_counter() - start
        del text  # the sub-index keeps its own copy; what stays is the index alone
        rss_after = _rss_bytes()
        print(json.dumps({
            "tokens": index.num_tokens,
            "build_s": round(build_s, 2),
            "tokens_per_s": round(index.num_tokens / build_s),
            "accounted_bytes_per_token": round(index.resident_bytes / index.num_tokens, 3),
            "rss_bytes_per_token": round(
                (rss_after - rss_before + text_bytes) / index.num_tokens, 3
            ),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }), flush=True)
        del index


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


if __name__ == "__main__":
    main()
