"""Snapshot load time and resident memory, in fresh processes.

Loads a snapshot (e.g. one written by ``datastore-builder build``) several
times, each in a new process so nothing is cached in Python, with and without
checksum verification, and prints one JSON object per mode: load seconds (min
and max over runs) and the process's RSS growth per token after the load.

    python drafter_bench/snapshot_load.py /tmp/corpus-snapshot --runs 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = """
import json, sys, time
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) * 1024
from drafter_service.snapshot.store import load_snapshot
before = rss()
start = time.perf_counter()
datastore, info = load_snapshot(sys.argv[1], verify_checksums=sys.argv[2] == '1')
seconds = time.perf_counter() - start
print(json.dumps({'seconds': seconds, 'tokens': datastore.num_tokens,
                  'rss_bytes_per_token': (rss() - before) / max(1, datastore.num_tokens)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    for verify in (True, False):
        runs = []
        for _ in range(args.runs):
            out = subprocess.run([sys.executable, "-c", CHILD, args.snapshot, str(int(verify))],
                                 check=True, capture_output=True, text=True).stdout
            runs.append(json.loads(out))
        print(json.dumps({
            "verify_checksums": verify,
            "tokens": runs[0]["tokens"],
            "load_s_min": round(min(r["seconds"] for r in runs), 3),
            "load_s_max": round(max(r["seconds"] for r in runs), 3),
            "rss_bytes_per_token": round(max(r["rss_bytes_per_token"] for r in runs), 3),
        }))


if __name__ == "__main__":
    main()
