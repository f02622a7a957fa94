"""``drafter-bench scale``: drafter replicas that learn as one through a shared log (issue 14).

For each replica count of ``--replicas`` (e.g. ``1,3``) this starts a real Redis
(``redis-server``: append-only file, fsync every second, no RDB saves) and that many
``drafter serve`` processes on loopback, all following one Redis stream, and measures:

1. **Step time** (``--skip-steps`` to skip): ``--batch`` requests replay recorded
   generations from ``--data`` as in ``drafter-bench load`` (deltas, accepted length plus
   the bonus token, finished requests finished and replaced), through one
   ``ReplicaSetClient`` over all replicas: one call per replica per step, in parallel.
   Every replica is seeded with the same builder snapshot of ``--corpus`` (``drafter
   serve --snapshot``, as ``load`` seeds its service: the pinned corpus ``seed``, drafted
   from beside the learned data). Reported: ``step_ms_p50``/``p99`` of ``client.step()`` and
   ``fallback_rate``, the share of steps slower than ``--deadline-ms``.
2. **Ingest-to-visible latency** (``--skip-visible``): ``--visible-samples`` random
   documents of 64 distinct token ids (seeded), each ingested through one replica in turn;
   timed from the ingest call until a fresh request whose context is the document's
   first 16 tokens gets, from *every* replica, a tree that drafts the document's 17th
   token (a child of the root; each replica polled about every 2 ms; a replica's time is
   when its successful probe returns). Not "the tree's first node": drafting fuses the
   matches of several prefix lengths and sources, and for about 4% of such documents the
   6.4M-token corpus's continuation of the context's last token ranks above the
   document's own (measured). This measures the log + fold path:
   the append to the stream, every replica's follower, its rebuild and the swap into its
   drafter. The replicas rebuild as soon as anything waits (``--rebuild-min-tokens 1``)
   and at least every ``--rebuild-interval-s``; a production schedule (default 1M tokens
   or 60 s) adds its own wait on top.
3. **Live τ split over workers** (``--skip-tau``): fresh, empty replicas on a fresh
   stream; ``--workers`` threads, each with its own ``ReplicaSetClient`` over all
   replicas, greedily replay the first ``--tau-records`` records of ``--tau-data`` in
   lockstep rounds: in round r worker w replays record r*W+w (all W at once); then the
   round's generations are finished (stored, durable) in worker order, one at a time,
   and every replica must have taken the whole stream and folded it (equal content
   digests) before the next round. The datastore each round drafts from is then the same
   whatever the replica count, so τ (output tokens / steps, as ``drafter-bench replay``
   counts it) must be too: ``tau_ratio`` is τ over the 1-replica run's τ. These replicas
   run without the recent tier (``recent_samples=0``), whose sharing of requests in
   flight is per replica by design, so the rounds compare what the shared log gives.

One JSON object per replica count with ``--json`` (its ``command`` is the full command
line with every setting), else ``key: value`` lines.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from datastore_builder.builder_cli import positive
from drafter_bench.acceptance import accepted_length
from drafter_bench.load import _cpu_list, _cpus_text, _pin_process, add_step_options, decode_loop
from drafter_bench.redis_server import RedisServer, free_port, listening_address, stop_process
from drafter_bench.token_records import Record, data_name, iter_documents, read_records
from drafter_service.datastore.sub_indices import Datastore, SubIndex
from drafter_service.replication.shared_log import SharedLogConfig
from drafter_service.snapshot.store import TokenizerIdentity, write_snapshot
from verifier_client import DrafterClient, Outcome, ReplicaSetClient

_ADMIN_TOKEN = "drafter-bench-scale-admin-token"
_DOC_TOKENS = 64  # an ingest-to-visible document
_CONTEXT_TOKENS = 16  # its prefix a probe drafts after
_POLL_S = 0.002  # shortest interval between two probes of one replica
_START_TIMEOUT_S = 120.0
_CONVERGE_TIMEOUT_S = 120.0
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20),
                    ("grpc.max_send_message_length", 64 << 20)]  # fmt: skip


def add_scale_parser(subparsers: Any) -> None:
    """Registers ``scale`` (replicas sharing a log: step time, visibility, split τ)."""
    p = subparsers.add_parser("scale", help="replicas on a shared log: step time, "
                              "ingest-to-visible latency, live tau split over workers",
                              description=__doc__.splitlines()[0])  # fmt: skip
    p.add_argument(
        "--replicas",
        type=_counts,
        default=(1, 3),
        metavar="N[,N...]",
        help="replica counts, one run each (default 1,3)",
    )
    p.add_argument(
        "--data",
        required=True,
        metavar="FILE",
        help="records replayed by the step-time part (.jsonl[.gz])",
    )
    p.add_argument(
        "--corpus",
        metavar="FILE",
        help="step time and visibility: every replica is seeded with a datastore "
        "prebuilt from these records' output_ids",
    )
    p.add_argument("--batch", type=positive, default=64, help="concurrent requests (default 64)")
    add_step_options(p)  # --budget also in the visibility and τ parts
    p.add_argument(
        "--visible-samples",
        type=positive,
        default=50,
        help="documents timed from ingest to visible on every replica (default 50)",
    )
    p.add_argument(
        "--rebuild-interval-s",
        type=float,
        default=0.05,
        help="the replicas' --rebuild-interval-s (default 0.05; they also rebuild "
        "once 1 token waits)",
    )
    p.add_argument(
        "--tau-data", metavar="FILE", help="records replayed by the τ part (default: --data)"
    )
    p.add_argument(
        "--tau-records",
        type=positive,
        default=150,
        help="records replayed by the τ part (default 150)",
    )
    p.add_argument(
        "--workers",
        type=positive,
        default=3,
        help="τ part: worker threads, one client each (default 3)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the visibility documents")
    p.add_argument("--vocab-size", type=positive, default=128256)
    p.add_argument(
        "--draft-threads",
        type=positive,
        help="each replica's --draft-threads (default: serve's, or the number of --server-cpus)",
    )
    p.add_argument(
        "--server-cpus",
        type=_cpu_list,
        metavar="LIST",
        help="pin every replica to these CPUs (e.g. 1)",
    )
    p.add_argument(
        "--client-cpus",
        type=_cpu_list,
        metavar="LIST",
        help="pin this process (clients, decode loops) to these CPUs (e.g. 0)",
    )
    for part in ("steps", "visible", "tau"):
        p.add_argument(f"--skip-{part}", action="store_true", help=f"skip the {part} part")
    p.add_argument("--json", action="store_true", help="one JSON object per replica count")
    p.set_defaults(func=run_scale)


def _counts(text: str) -> tuple[int, ...]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected counts like 1,3, got {text!r}") from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"replica counts must be >= 1, got {text!r}")
    return tuple(dict.fromkeys(values))


def _command(args: argparse.Namespace) -> str:
    """The command line with every setting spelled out (defaults included)."""
    words = ["drafter-bench", "scale"]
    for name, value in vars(args).items():
        flag = "--" + name.replace("_", "-")
        if name in ("func", "command") or value is None or value is False:
            continue
        if value is True:
            words.append(flag)
        elif isinstance(value, tuple):
            words += [flag, ",".join(map(str, value))]
        elif isinstance(value, frozenset):
            words += [flag, _cpus_text(value) or ""]
        else:
            words += [flag, str(value)]
    return " ".join(words)


# --- the processes


@dataclass(slots=True)
class _Replica:
    proc: subprocess.Popen[str]
    target: str  # host:port of its gRPC service
    admin_port: int
    log_path: Path  # its stderr

    def digest(self) -> dict[str, Any]:
        """``GET /v1/datastores/default/digest`` of its admin API."""
        url = f"http://127.0.0.1:{self.admin_port}/v1/datastores/default/digest"
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {_ADMIN_TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            result: dict[str, Any] = json.load(response)
        return result


@contextlib.contextmanager
def _replicas(
    args: argparse.Namespace, count: int, root: Path, log_url: str, prefix: str,
    snapshot: Path | None, extra: Sequence[str] = (),
) -> Iterator[list[_Replica]]:  # fmt: skip
    """``count`` ``drafter serve`` processes following stream ``prefix`` of ``log_url``,
    each seeded with ``snapshot`` if given, with ``extra`` flags; started at once, stopped
    on exit."""
    root.mkdir(parents=True)
    token_file = root / "admin-token"
    token_file.write_text(_ADMIN_TOKEN)
    pin = None
    threads = args.draft_threads
    if args.server_cpus is not None:
        pin = functools.partial(os.sched_setaffinity, 0, args.server_cpus)
        threads = threads or len(args.server_cpus)  # serve counts the machine's CPUs
    started: list[_Replica] = []
    try:
        for i in range(count):
            admin_port = free_port()
            cmd = [sys.executable, "-m", "drafter_service.drafter_cli", "serve",
                   "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0",
                   "--admin-port", str(admin_port), "--admin-token-file", str(token_file),
                   "--data-dir", str(root / f"replica-{i}"), "--vocab-size", str(args.vocab_size),
                   "--shared-log", log_url, "--shared-log-prefix", prefix,
                   "--rebuild-min-tokens", "1",
                   "--rebuild-interval-s", str(args.rebuild_interval_s),
                   "--snapshot-interval-s", "0", "--grace-period-s", "0.5"]  # fmt: skip
            cmd += list(extra)
            if snapshot is not None:
                cmd += ["--snapshot", str(snapshot)]
            if threads is not None:
                cmd += ["--draft-threads", str(threads)]
            log_path = root / f"replica-{i}.log"
            with log_path.open("w") as log:
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                                        preexec_fn=pin)  # fmt: skip
            started.append(_Replica(proc, "", admin_port, log_path))
        for replica in started:
            replica.target = listening_address(replica.proc, replica.log_path)
        yield started
    finally:
        for replica in started:
            stop_process(replica.proc)


def _converged(
    replicas: Sequence[_Replica], log_url: str, prefix: str, settle_s: float = 0.005
) -> dict[str, Any]:
    """Waits until every replica has folded the stream up to its newest entry (consumed and
    covered offsets both that entry, nothing pending, equal content digests), and still
    shows that ``settle_s`` later; returns the common digest.

    Pending 0 with the newest entry consumed is not enough: a rebuild takes the pending
    documents (pending drops to 0) before it folds them, and the digest changes only once
    it has swapped the new sub-indices in, which is when the covered offset moves. The
    second look lets the swap reach the drafter (it follows the covered offset) and, with
    a longer ``settle_s``, lets a service append what it still had queued."""
    stream = SharedLogConfig(log_url, prefix).stream("default")
    deadline = time.monotonic() + _CONVERGE_TIMEOUT_S
    seen: tuple[str | None, str] | None = None
    try:
        while True:
            last = stream.last_id()
            digests = [r.digest() for r in replicas]
            state = (None if last is None else str(last), str(digests[0]["content_sha256"]))
            if all(d["pending_tokens"] == 0 and d["consumed_offset"] == state[0]
                   and d["covered_offset"] == state[0] and d["content_sha256"] == state[1]
                   for d in digests):  # fmt: skip
                if seen == state:
                    return digests[0]
                seen = state
                time.sleep(settle_s)
                continue
            seen = None
            if time.monotonic() > deadline:
                raise RuntimeError(f"replicas did not converge: {digests}")
            time.sleep(0.005)
    finally:
        stream.close()


def _write_corpus_snapshot(args: argparse.Namespace, directory: Path) -> Path:
    """The ``--corpus`` datastore as a builder snapshot every replica is seeded with."""
    index = SubIndex.build(iter_documents(args.corpus, vocab_size=args.vocab_size),
                           args.vocab_size)  # fmt: skip
    write_snapshot(directory, Datastore([index], args.vocab_size),
                   TokenizerIdentity("bench", args.vocab_size, ""))  # fmt: skip
    return directory


# --- the parts


def _percentiles(prefix: str, values_ms: Sequence[float]) -> dict[str, float]:
    values = np.asarray(values_ms, dtype=np.float64)
    return {f"{prefix}_p50": round(float(np.percentile(values, 50)), 3),
            f"{prefix}_p99": round(float(np.percentile(values, 99)), 3),
            f"{prefix}_max": round(float(values.max()), 3)}  # fmt: skip


def _measure_steps(
    args: argparse.Namespace, targets: Sequence[str], records: Sequence[Record]
) -> dict[str, Any]:
    """``drafter-bench load``'s decode loop, through a ReplicaSetClient."""
    client = ReplicaSetClient(targets, deadline_ms=args.client_deadline_ms, mode=args.mode,
                              channel_options=_CHANNEL_OPTIONS)  # fmt: skip
    client.wait_ready(timeout_s=30)
    run = decode_loop(client, records, batch=args.batch, budget=args.budget, steps=args.steps,
                      warmup=args.warmup, prefix="scale")  # fmt: skip
    client.close()
    latencies_ms = [ns / 1e6 for ns in run.waits_ns]
    fallbacks = sum(ms > args.deadline_ms for ms in latencies_ms)
    return {
        **_percentiles("step_ms", latencies_ms),
        "step_ms_p999": round(float(np.percentile(latencies_ms, 99.9)), 3),
        "steps_per_s": round(len(latencies_ms) / run.wall_s, 1),
        "fallbacks": fallbacks, "fallback_rate": round(fallbacks / len(latencies_ms), 4),
        "failed_steps": run.failed, "resyncs": run.resyncs,
        "step_tau": round(run.committed / (len(latencies_ms) * args.batch), 4),
    }  # fmt: skip


def _drafts_next(client: DrafterClient, request_id: str, doc: list[int], budget: int) -> bool:
    """Whether a fresh request whose context is the start of ``doc`` gets a tree drafting
    the document's next token."""
    client.add_request(request_id, doc[:_CONTEXT_TOKENS])
    tree = client.step({request_id: []}, {request_id: budget})[request_id]
    client.abort(request_id)
    return (
        tree is not None
        and accepted_length(tree.tokens.tolist(), tree.parents.tolist(), doc, _CONTEXT_TOKENS) > 0
    )


def _measure_visible(args: argparse.Namespace, replicas: Sequence[_Replica]) -> dict[str, Any]:
    """Ingest through one replica in turn, time until every replica drafts from it."""
    clients = [DrafterClient(r.target, mode="unary", deadline_ms=args.client_deadline_ms)
               for r in replicas]  # fmt: skip
    for client in clients:
        client.wait_ready(timeout_s=30)
    rng = np.random.default_rng(args.seed)
    probes = itertools.count()
    all_ms: list[float] = []
    own_ms: list[float] = []  # visible on the replica it was ingested through
    try:
        while len(all_ms) < args.visible_samples:
            # Distinct ids: the probe's own context never continues itself (input trie).
            doc = (rng.choice(args.vocab_size - 1, _DOC_TOKENS, replace=False) + 1).tolist()
            if _drafts_next(clients[0], f"probe-{next(probes)}", doc, args.budget):
                continue  # already drafted before its ingest (a chance match): draw another
            through = len(all_ms) % len(clients)
            start = time.perf_counter()
            if not clients[through].ingest([doc]):
                raise RuntimeError("the client's work queue dropped an ingest")
            seen: dict[int, float] = {}
            while len(seen) < len(clients):
                round_start = time.perf_counter()
                for i, client in enumerate(clients):
                    if i not in seen and _drafts_next(client, f"probe-{next(probes)}", doc,
                                                      args.budget):  # fmt: skip
                        seen[i] = (time.perf_counter() - start) * 1e3
                if time.perf_counter() - start > _CONVERGE_TIMEOUT_S:
                    raise RuntimeError(
                        f"document {len(all_ms)} not visible on every replica "
                        f"after {_CONVERGE_TIMEOUT_S} s (visible on {seen})"
                    )
                time.sleep(max(0.0, _POLL_S - (time.perf_counter() - round_start)))
            all_ms.append(max(seen.values()))
            own_ms.append(seen[through])
    finally:
        for client in clients:
            client.close()
    return {**_percentiles("visible_ms", all_ms), "visible_samples": len(all_ms),
            "visible_own_ms_p50": round(float(np.percentile(own_ms, 50)), 3)}  # fmt: skip


def _replay_record(client: ReplicaSetClient, request_id: str, record: Record, budget: int
                   ) -> tuple[int, int, list[int]]:  # fmt: skip
    """Greedy replay of one record (``drafter_bench.replay``'s step rule); returns its steps,
    the steps whose tree was lost (not OK) and the tokens committed by the last step."""
    output = record.output_ids.tolist()
    client.add_request(request_id, record.prompt_ids)
    p = steps = lost = 0
    delta: list[int] = []
    while p < len(output):
        result = client.step({request_id: delta}, {request_id: budget})
        tree = result[request_id]
        lost += tree is None and result.why(request_id) is not Outcome.OK
        got = 0 if tree is None else accepted_length(tree.tokens.tolist(),
                                                     tree.parents.tolist(), output, p)  # fmt: skip
        commit = min(got + 1, len(output) - p)
        delta = output[p : p + commit]
        p += commit
        steps += 1
    return steps, lost, delta


def _lost_work(client: ReplicaSetClient) -> tuple[int, int, int]:
    """The client's counters that move when finished work is not stored as sent."""
    stats = client.stats
    return stats.background_failures, stats.ingest_drops, stats.reingested


def _measure_tau(
    args: argparse.Namespace, replicas: Sequence[_Replica], records: Sequence[Record],
    converge: Callable[[], dict[str, Any]],
) -> dict[str, Any]:  # fmt: skip
    """Lockstep rounds of ``--workers`` concurrent replays, finishes in worker order, and
    ``converge()`` between rounds."""
    targets = [r.target for r in replicas]
    clients = [ReplicaSetClient(targets, deadline_ms=args.client_deadline_ms, mode=args.mode,
                                channel_options=_CHANNEL_OPTIONS)
               for _ in range(args.workers)]  # fmt: skip
    steps = lost = output_tokens = 0
    start = time.perf_counter()
    digest: dict[str, Any] = {}
    try:
        for client in clients:
            client.wait_ready(timeout_s=30)
        with ThreadPoolExecutor(max_workers=args.workers) as pool:
            for first in range(0, len(records), args.workers):
                batch = records[first : first + args.workers]
                rids = [f"tau-{first + w}" for w in range(len(batch))]
                runs = [pool.submit(_replay_record, clients[w], rids[w], record, args.budget)
                        for w, record in enumerate(batch)]  # fmt: skip
                # Every replay of the round ends before the first finish: a finish folded
                # while another worker still drafts would make its trees depend on timing.
                results = [run.result() for run in runs]
                for w, (record_steps, record_lost, last) in enumerate(results):
                    steps, lost = steps + record_steps, lost + record_lost
                    output_tokens += len(batch[w].output_ids)
                    before = _lost_work(clients[w])
                    clients[w].finish(rids[w], tail=last, store=True, durable=True)
                    # flush() returns once the call was made, even if it failed.
                    if not clients[w].flush(60) or _lost_work(clients[w]) != before:
                        raise RuntimeError(f"the finish of {rids[w]} was not stored as sent")
                digest = converge()
    finally:
        for client in clients:
            client.close()
    return {
        "tau": round(output_tokens / steps, 4), "tau_records": len(records),
        "tau_steps": steps, "tau_output_tokens": output_tokens, "tau_lost_steps": lost,
        "tau_content_sha256": digest.get("content_sha256"),
        "tau_datastore_tokens": digest.get("num_tokens"),
        "tau_wall_s": round(time.perf_counter() - start, 1),
    }  # fmt: skip


# --- the command


def run_scale(args: argparse.Namespace) -> int:
    """Runs every replica count of ``--replicas`` and prints one report each."""
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    if args.rebuild_interval_s <= 0:
        raise ValueError(f"--rebuild-interval-s must be > 0, got {args.rebuild_interval_s}")
    args.tau_data = args.tau_data or args.data
    records = tau_records = None
    if not args.skip_steps:
        records = [r for r in read_records(args.data, vocab_size=args.vocab_size)
                   if len(r.output_ids)]  # fmt: skip
        if not records:
            raise ValueError(f"{args.data}: no record with output tokens")
    if not args.skip_tau:
        tau_records = [r for r in read_records(args.tau_data, vocab_size=args.vocab_size)
                       if len(r.output_ids)][: args.tau_records]  # fmt: skip
        if not tau_records:
            raise ValueError(f"{args.tau_data}: no record with output tokens")
    command = _command(args)
    if args.client_cpus is not None:
        _pin_process(args.client_cpus)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="drafter-bench-scale-") as tmp:
        snapshot = None
        if args.corpus and not (args.skip_steps and args.skip_visible):
            snapshot = _write_corpus_snapshot(args, Path(tmp) / "corpus")
        for count in args.replicas:
            row = _run_count(args, count, Path(tmp) / f"replicas-{count}", snapshot,
                             records, tau_records)  # fmt: skip
            row["command"] = command
            single = next((r for r in rows if r["replicas"] == 1), None)
            if single is not None and row["tau"] is not None and single["tau"]:
                row["tau_ratio"] = round(row["tau"] / single["tau"], 4)
                row["tau_content_equal"] = row["tau_content_sha256"] == single["tau_content_sha256"]
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                for key, value in row.items():
                    print(f"{key:>22}: {value}")
                print(flush=True)
    return 0


def _run_count(
    args: argparse.Namespace, count: int, root: Path, snapshot: Path | None,
    records: Sequence[Record] | None, tau_records: Sequence[Record] | None,
) -> dict[str, Any]:  # fmt: skip
    """One replica count: a Redis, the seeded replicas (steps, visibility), then fresh ones
    on a fresh stream (τ)."""
    row: dict[str, Any] = {
        "replicas": count, "data": data_name(args.data),
        "corpus": data_name(args.corpus) if args.corpus else None,
        "batch": args.batch, "budget": args.budget, "mode": args.mode,
        "steps": None if args.skip_steps else args.steps, "warmup": args.warmup,
        "deadline_ms": args.deadline_ms, "client_deadline_ms": args.client_deadline_ms,
        "rebuild_interval_s": args.rebuild_interval_s, "rebuild_min_tokens": 1,
        "draft_threads": args.draft_threads,
        "server_cpus": _cpus_text(args.server_cpus), "client_cpus": _cpus_text(args.client_cpus),
        "tau_data": data_name(args.tau_data), "workers": args.workers,
        "loadavg_before": round(os.getloadavg()[0], 2),
        "step_ms_p50": None, "step_ms_p99": None, "fallback_rate": None,
        "visible_ms_p50": None, "visible_ms_p99": None,
        "tau": None, "tau_ratio": None, "tau_content_equal": None,
    }  # fmt: skip
    root.mkdir(parents=True)
    log = RedisServer(root / "redis", appendfsync="everysec")
    log_url = log.url
    try:
        if not (args.skip_steps and args.skip_visible):
            with _replicas(args, count, root / "seeded", log_url, "scale", snapshot) as replicas:
                _converged(replicas, log_url, "scale")
                if records is not None:
                    row.update(_measure_steps(args, [r.target for r in replicas], records))
                    # The finishes' folds are done before visibility is timed.
                    _converged(replicas, log_url, "scale", settle_s=0.2)
                if not args.skip_visible:
                    row.update(_measure_visible(args, replicas))
        if tau_records is not None:
            # No recent tier: what is compared is what the shared log gives (the tier's
            # in-flight sharing is per replica, docs/scale-out.md).
            no_tier = ("--draft-config", "recent_samples=0")
            with _replicas(args, count, root / "empty", log_url, "scale-tau", None,
                           no_tier) as replicas:  # fmt: skip
                row.update(
                    _measure_tau(
                        args,
                        replicas,
                        tau_records,
                        lambda: _converged(replicas, log_url, "scale-tau"),
                    )
                )
    finally:
        log.stop()
    return row
