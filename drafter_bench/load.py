"""``drafter-bench load``: step latency of the real drafting service under a decode-like load.

Drives ``--batch`` concurrent requests through the real client
(``verifier_client.DrafterClient``: one long-lived stream, or unary calls; one
packed DraftRequest per decode step), exactly as a decode worker would: each
request replays a real recorded generation, sends only the tokens committed
since its last step, and advances by the accepted length of the tree it got
back plus the bonus token (one token when a step has no tree), so trees and
deltas are real. The step time is ``client.step()``: client → service → trees →
client. Finished requests are finished (ingested in the background) and
replaced by the next record. ``--siblings N`` replays the records in groups of N answers
to one prompt, so that siblings are in flight together (the recent tier's case).

Without ``--target`` a service is started as a subprocess (``drafter serve``) on
loopback, with a datastore prebuilt from ``--corpus`` if given. ``--server-cpus`` and
``--client-cpus`` pin the started service and this process (client, decode loop) to
CPU sets, e.g. one core each; the service then drafts with one thread per CPU it has.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from datastore_builder.builder_cli import positive
from drafter_bench.acceptance import accepted_length
from drafter_bench.redis_server import listening_address
from drafter_bench.replay import sibling_groups
from drafter_bench.token_records import Record, iter_documents, read_records
from drafter_bench.unauth_flood import cpu_s
from drafter_service.drafting.draft_config import config_pair_argument
from verifier_client import ClientStats, DrafterClient, StepResult


def add_load_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("load", help="step latency of the gRPC service under load",
                              description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, metavar="FILE", help="records to replay (.jsonl[.gz])")
    p.add_argument("--target", metavar="HOST:PORT", help="a running service (default: start one)")
    p.add_argument("--corpus", metavar="FILE",
                   help="without --target: the started service's datastore is prebuilt from "
                        "these records' output_ids")
    p.add_argument("--snapshot", metavar="DIR",
                   help="without --target: the started service starts from this snapshot "
                        "(built once, e.g. by datastore-builder build; instead of --corpus)")
    p.add_argument("--batch", type=int, default=64, help="concurrent requests (default 64)")
    p.add_argument("--siblings", type=int, default=0, metavar="N",
                   help="replay the records in groups of N answers to one prompt, one after "
                        "another (the first N of each prompt with at least N), so siblings "
                        "run together as parallel samples do (default 0: file order)")
    add_step_options(p)
    p.add_argument("--vocab-size", type=int, default=128256)
    p.add_argument("--server-cpus", type=_cpu_list, metavar="LIST",
                   help="without --target: pin the started service to these CPUs (e.g. 1 or "
                        "2-3); its drafting threads default to their number")
    p.add_argument("--client-cpus", type=_cpu_list, metavar="LIST",
                   help="pin this process (client and decode loop) to these CPUs (e.g. 0)")
    p.add_argument("--verify-ms", type=_non_negative, default=0.0, metavar="V",
                   help="sleep V ms between a step's answer and the next step, as a GPU's "
                        "forward pass would (default 0)")
    p.add_argument("--node-score", metavar="hand|default|FILE",
                   help="passed to the started service's drafter serve --node-score "
                        "(default: serve's own choice, the shipped learned score)")
    p.add_argument("--draft-config", action="append", default=[], type=config_pair_argument,
                   metavar="KEY=VALUE",
                   help="passed to the started service's drafter serve --draft-config "
                        "(a DraftConfig field, e.g. the SSSD paper's "
                        "datastore_min_tree_nodes=50); repeatable")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_load)


def add_step_options(p: argparse.ArgumentParser) -> None:
    """The options of :func:`decode_loop`'s steps, the same in ``load`` and ``scale``."""
    p.add_argument("--budget", type=positive, default=16,
                   help="draft budget per request (default 16)")
    p.add_argument("--steps", type=positive, default=2000, help="measured steps (default 2000)")
    p.add_argument("--warmup", type=int, default=100, help="unmeasured first steps (default 100)")
    p.add_argument("--deadline-ms", type=float, default=3.0,
                   help="a step slower than this counts as a fallback (default 3)")
    p.add_argument("--client-deadline-ms", type=float, default=1000.0,
                   help="the client's own step deadline; large by default so that the "
                        "measured latency is the real one and no step loses its tree "
                        "(default 1000)")
    p.add_argument("--mode", choices=("stream", "unary"), default="stream")


def _cpu_list(text: str) -> frozenset[int]:
    """CPU ids as taskset writes them: ``0``, ``0,2``, ``1-3``."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a CPU list: {text!r}") from None
        if first < 0 or last < first:
            raise argparse.ArgumentTypeError(f"not a CPU list: {text!r}")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def _pin_process(cpus: frozenset[int]) -> None:
    """Pins every thread of this process (sched_setaffinity applies to one thread; threads
    started later inherit it)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # the thread ended meanwhile
            pass


@dataclass(slots=True)
class _LoadLane:
    request_id: str
    record: Record
    output: list[int]
    p: int = 0  # output tokens committed
    delta: list[int] = field(default_factory=list)  # committed since the last step


def run_load(args: argparse.Namespace) -> int:
    if args.corpus and args.snapshot:
        raise ValueError("--corpus and --snapshot both seed the started service: give one")
    service_flags = {"--server-cpus": args.server_cpus is not None,
                     "--snapshot": args.snapshot is not None,
                     "--node-score": args.node_score is not None,
                     "--draft-config": bool(args.draft_config)}  # fmt: skip
    for flag, given in service_flags.items():
        if given and args.target is not None:
            raise ValueError(f"{flag} sets up the service load starts; with --target, set it "
                             "up there")  # fmt: skip
    records = [r for r in read_records(args.data, vocab_size=args.vocab_size) if len(r.output_ids)]
    if args.siblings < 0:
        raise ValueError(f"--siblings {args.siblings} must be >= 0")
    if args.siblings:
        records = sibling_groups(records, args.siblings)
    if not records:
        raise ValueError(f"{args.data}: no record with output tokens"
                         + (f" in groups of {args.siblings}" if args.siblings else ""))
    with tempfile.TemporaryDirectory(prefix="drafter-bench-load-") as tmp:
        proc: subprocess.Popen[str] | None = None
        target = args.target
        if target is None:
            proc, target = _start_server(args, Path(tmp))
        if args.client_cpus is not None:
            _pin_process(args.client_cpus)
        try:
            cpu_before = cpu_s(proc.pid) if proc is not None else 0.0
            report = _drive(args, target, records)
            if proc is not None:
                # The service's own CPU time (all its threads) per request-step, warm-up
                # included: what one request costs the drafting pod's cores each step.
                request_steps = (args.steps + args.warmup) * args.batch
                used_s = cpu_s(proc.pid) - cpu_before
                report["server_cpu_us_per_request_step"] = round(1e6 * used_s / request_steps, 2)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>22}: {value}")
    return 0


def _start_server(args: argparse.Namespace, tmp: Path) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "drafter_service.drafter_cli", "serve", "--host", "127.0.0.1",
           "--port", "0", "--metrics-port", "0", "--admin-port", "-1",
           "--data-dir", str(tmp / "data"),
           "--vocab-size", str(args.vocab_size),
           # The replay loops over the dev set: rebuilds brought forward would fold its own
           # answers back in and draft later passes from them. Stored, but folded in only
           # on the interval, as before rebuild_max_share.
           "--rebuild-max-share", "0"]
    if args.corpus:
        write_corpus_snapshot(args.corpus, args.vocab_size, tmp / "corpus")
        cmd += ["--snapshot", str(tmp / "corpus")]
    elif args.snapshot:
        cmd += ["--snapshot", str(args.snapshot)]
    if args.node_score is not None:
        cmd += ["--node-score", args.node_score]
    for key, value in args.draft_config:
        cmd += ["--draft-config", f"{key}={value}"]
    pin = None
    if args.server_cpus is not None:
        # drafter serve's default is a thread per CPU of the machine, not of its CPU set.
        cmd += ["--draft-threads", str(len(args.server_cpus))]
        pin = functools.partial(os.sched_setaffinity, 0, args.server_cpus)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, preexec_fn=pin)
    return proc, listening_address(proc)


def write_corpus_snapshot(corpus: str | Path, vocab_size: int, path: Path) -> Path:
    """A snapshot at ``path`` of one sub-index over the records' ``output_ids`` (what the
    benchmarks seed a started ``drafter serve`` with)."""
    from drafter_service.datastore.sub_indices import Datastore, SubIndex
    from drafter_service.snapshot.store import TokenizerIdentity, write_snapshot

    index = SubIndex.build(iter_documents(corpus, vocab_size=vocab_size), vocab_size)
    write_snapshot(path, Datastore([index], vocab_size), TokenizerIdentity("bench", vocab_size, ""))
    return path


class DecodeClient(Protocol):
    """What the decode loop needs of a client (DrafterClient, ReplicaSetClient)."""

    @property
    def stats(self) -> ClientStats: ...
    def add_request(self, request_id: str, prompt_ids: Iterable[int]) -> None: ...
    def step(
        self, commits: Mapping[str, Iterable[int]], budgets: Mapping[str, int] | None = None
    ) -> StepResult: ...
    def finish(self, request_id: str, *, tail: Iterable[int] = ()) -> bool: ...


@dataclass(slots=True)
class DecodeRun:
    """What :func:`decode_loop` measured over its measured steps."""

    waits_ns: list[int]  # every step: how long the decode loop waited for its drafts
    wall_s: float
    accepted: int = 0
    committed: int = 0
    finished: int = 0
    failed: int = 0
    resyncs: int = 0


def decode_loop(
    client: DecodeClient,
    records: Sequence[Record],
    *,
    batch: int,
    budget: int,
    steps: int,
    warmup: int,
    verify_ms: float = 0.0,
    prefix: str = "load",
) -> DecodeRun:
    """A worker's decode loop over ``client``: ``batch`` requests replaying ``records``
    greedily (a step commits the accepted tokens plus one), each finished request
    replaced by the next record; ``warmup`` unmeasured steps, then ``steps`` measured
    ones. ``verify_ms``: sleep between a step's answer and the next step, as a GPU's
    forward pass would."""
    serial = itertools.count()
    source = itertools.cycle(records)

    def new_lane() -> _LoadLane:
        record = next(source)
        lane = _LoadLane(f"{prefix}-{next(serial)}", record, record.output_ids.tolist())
        client.add_request(lane.request_id, record.prompt_ids)
        return lane

    lanes = [new_lane() for _ in range(batch)]
    run = DecodeRun([], 0.0)
    before = ClientStats()
    wall_start = 0.0
    for step in range(warmup + steps):
        measured = step >= warmup
        if step == warmup:
            wall_start = time.perf_counter()
            before = dataclasses.replace(client.stats)
        commits = {lane.request_id: lane.delta for lane in lanes}
        budgets = dict.fromkeys(commits, budget)
        start = time.perf_counter_ns()
        result = client.step(commits, budgets)
        elapsed = time.perf_counter_ns() - start
        if measured:
            run.waits_ns.append(elapsed)
            run.failed += not result.ok
        if verify_ms:  # the target model verifies the trees meanwhile
            time.sleep(verify_ms / 1e3)
        for i, lane in enumerate(lanes):
            tree = result[lane.request_id]
            got = 0  # no tree: the step decodes one token, as without speculation
            if tree is not None:
                got = accepted_length(tree.tokens.tolist(), tree.parents.tolist(), lane.output,
                                      lane.p)  # fmt: skip
            commit = min(got + 1, len(lane.output) - lane.p)
            lane.delta = lane.output[lane.p : lane.p + commit]
            lane.p += commit
            if measured:
                run.accepted, run.committed = run.accepted + got, run.committed + commit
            if lane.p == len(lane.output):
                client.finish(lane.request_id, tail=lane.delta)
                run.finished += 1
                lanes[i] = new_lane()
    run.wall_s = time.perf_counter() - wall_start
    after = client.stats
    run.resyncs = after.resyncs - before.resyncs
    return run


def _drive(args: argparse.Namespace, target: str, records: Sequence[Record]) -> dict[str, Any]:
    """The decode loop of a worker, with the real client (verifier_client.DrafterClient):
    delta tracking, packed calls, RESYNC handling, background finishes."""
    client = DrafterClient(
        target,
        deadline_ms=args.client_deadline_ms,
        mode=args.mode,
        channel_options=[("grpc.max_receive_message_length", 64 << 20),
                         ("grpc.max_send_message_length", 64 << 20)],
    )  # fmt: skip
    client.wait_ready(timeout_s=30)
    run = decode_loop(client, records, batch=args.batch, budget=args.budget, steps=args.steps,
                      warmup=args.warmup, verify_ms=args.verify_ms)  # fmt: skip
    client.close()
    lat_ms = np.asarray(run.waits_ns, dtype=np.float64) / 1e6
    return {
        "mode": args.mode, "batch": args.batch, "siblings": args.siblings,
        "budget": args.budget, "steps": len(lat_ms),
        "server_cpus": _cpus_text(args.server_cpus), "client_cpus": _cpus_text(args.client_cpus),
        "node_score": args.node_score, "draft_config": [f"{k}={v}" for k, v in args.draft_config],
        "step_ms_p50": round(float(np.percentile(lat_ms, 50)), 3),
        "step_ms_p99": round(float(np.percentile(lat_ms, 99)), 3),
        "step_ms_p999": round(float(np.percentile(lat_ms, 99.9)), 3),
        "step_ms_max": round(float(lat_ms.max()), 3),
        "steps_per_s": round(len(lat_ms) / run.wall_s, 1),
        "fallbacks": int(np.count_nonzero(lat_ms > args.deadline_ms)),
        "deadline_ms": args.deadline_ms, "failed_steps": run.failed, "resyncs": run.resyncs,
        "tau": round(run.committed / max(1, len(lat_ms) * args.batch), 4),
        "accepted_tokens": run.accepted, "finished": run.finished,
        "verify_ms": args.verify_ms,
    }


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def _cpus_text(cpus: frozenset[int] | None) -> str | None:
    return None if cpus is None else ",".join(map(str, sorted(cpus)))
