"""The client-only distribution (clients/python, `sssd-verifier-client`), checked on the
real wheel: built offline from this checkout, its file list and metadata read back,
then imported with nothing on sys.path but the standard library, the unpacked wheel
and the installed files of the dependencies its METADATA declares (so an undeclared
third-party import, or any import of the drafter, fails here)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterable
from email.message import Message
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from wheel_build import build_wheel

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[1]
CLIENT_PROJECT = ROOT / "clients" / "python"
TOP = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]

BASE = {"grpcio", "protobuf"}  # what verifier_client and the stubs import at runtime
WORKER = {"numpy", "torch", "transformers", "prometheus-client"}  # the `worker` extra
WORKER_IMPORTS = {"numpy", "torch", "transformers", "prometheus_client"}
SERVER_ONLY = {"pyarrow", "fastapi", "uvicorn", "tokenizers", "jinja2", "tqdm", "sssd-drafter"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("hatchling", reason="builds the client wheel (pip install '.[test]')")
    return build_wheel(CLIENT_PROJECT, tmp_path_factory.mktemp("client-wheel"), 300)


@pytest.fixture(scope="module")
def metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(archive.read(name).decode())


@pytest.fixture(scope="module")
def unpacked(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("client-site")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    return target


def _requirements(metadata: Message, extra: str = "") -> dict[str, Requirement]:
    """Requires-Dist entries that apply with ``extra`` ("" = a plain install)."""
    found: dict[str, Requirement] = {}
    for text in metadata.get_all("Requires-Dist") or []:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": extra}):
            found[canonicalize_name(requirement.name)] = requirement
    return found


def _top_level(extra: str = "") -> dict[str, Requirement]:
    entries = TOP["optional-dependencies"][extra] if extra else TOP["dependencies"]
    return {canonicalize_name(r.name): r for r in map(Requirement, entries)}


def test_wheel_ships_exactly_the_client_and_the_stubs(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        wheel_meta = archive.read(next(n for n in names if n.endswith(".dist-info/WHEEL")))
    assert wheel.name.endswith("-py3-none-any.whl")
    assert b"Root-Is-Purelib: true" in wheel_meta
    top = {n.split("/")[0] for n in names if ".dist-info/" not in n}
    assert top == {"verifier_client", "sssd_drafter"}
    # Nothing compiled, no caches, no server code.
    assert not [n for n in names if n.endswith((".so", ".pyd", ".dylib", ".dll", ".pyc"))]
    assert not [n for n in names if "drafter_service" in n or "datastore_builder" in n]
    # Every module of both packages, from the repository root, and nothing else.
    for package in ("verifier_client", "sssd_drafter"):
        in_repo = {
            p.relative_to(ROOT).as_posix()
            for p in (ROOT / package).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }
        assert {n for n in names if n.startswith(package + "/")} == in_repo
    assert "verifier_client/__init__.py" in names
    assert "verifier_client/client.py" in names
    for stub in ("__init__.py", "v1/__init__.py", "v1/drafter_pb2.py", "v1/drafter_pb2_grpc.py"):
        assert f"sssd_drafter/{stub}" in names


def test_metadata_version_python_and_dependencies(wheel: Path, metadata: Message) -> None:
    assert metadata["Name"] == "sssd-verifier-client"
    assert metadata["Version"] == TOP["version"]  # one version for both distributions
    assert wheel.name.startswith(f"sssd_verifier_client-{TOP['version']}-")
    assert metadata["Requires-Python"] == TOP["requires-python"]

    base = _requirements(metadata)
    assert set(base) == BASE
    assert not set(base) & (SERVER_ONLY | WORKER)
    top = {**_top_level("service"), **_top_level()}  # the drafter's gRPC side, its library
    for name in BASE:  # the same ranges as the drafter's (the stubs' runtime floor)
        assert base[name].specifier == top[name].specifier

    assert metadata.get_all("Provides-Extra") == ["sglang", "vllm", "worker"]
    for extra in ("vllm", "sglang"):  # the engine itself is the user's
        engine = {n: r for n, r in _requirements(metadata, extra).items() if n not in base}
        assert set(engine) == {"numpy", "prometheus-client"}
    worker = {n: r for n, r in _requirements(metadata, "worker").items() if n not in base}
    assert set(worker) == WORKER
    top_worker = _top_level("worker")
    for name in WORKER:
        assert worker[name].specifier == (top_worker.get(name) or top[name]).specifier
    assert worker["torch"].specifier.contains("2.13.0")


def test_the_wheel_registers_the_engine_plugins(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt"))
        entry_points = archive.read(name).decode()
    for group, module in (("vllm.general_plugins", "vllm"), ("sglang.srt.plugins", "sglang")):
        section = entry_points.split(f"[{group}]", 1)[1].split("[", 1)[0]
        target = f"verifier_client.engines.{module}:register"
        assert section.split() == ["sssd_drafter", "=", target]


# ---------------------------------------------------------------- importing the wheel

PROBE = """
import importlib, importlib.util, json, pkgutil, sys
wheel_dir, deps_dir = sys.argv[1:3]
sys.path[:0] = [wheel_dir, deps_dir]
for name in ("drafter_service", "datastore_builder", "drafter_bench", "benchmarks", "sssd"):
    assert importlib.util.find_spec(name) is None, name + " is importable"

import verifier_client
from verifier_client import DrafterClient
client = DrafterClient("127.0.0.1:1", deadline_ms=200.0, mode="unary")  # nothing listens
client.add_request("r1", [1, 2, 3])
result = client.step({"r1": [4]})  # a DraftRequest through the stubs, answered by a fallback
assert result["r1"] is None
client.close(timeout_s=1.0)

missing = {}
for info in pkgutil.iter_modules(verifier_client.__path__, "verifier_client."):
    try:
        importlib.import_module(info.name)
    except ModuleNotFoundError as error:
        missing[info.name] = error.name
outside = sorted(
    name for name, module in sys.modules.items()
    if name.split(".")[0] in ("verifier_client", "sssd_drafter") and module is not None
    and not str(getattr(module, "__file__", "")).startswith(wheel_dir)
)
print(json.dumps({"missing": missing, "outside": outside}))
"""


def _closure(requirements: Iterable[Requirement]) -> set[str]:
    """Installed distributions needed by ``requirements``, transitively."""
    seen: set[str] = set()
    todo = list(requirements)
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here, so nothing in the main venv can use it either
        seen.add(name)
        extras = {"", *requirement.extras}
        for text in dist.requires or []:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                todo.append(sub)
    return seen


def _link(base: Path, entries: set[tuple[str, ...]], dest: Path) -> None:
    """Symlinks a distribution's files into ``dest``: whole top-level packages and
    modules, but namespace directories (google/, nvidia/) entry by entry, so that
    other distributions' parts of them stay out."""
    for top in sorted({parts[0] for parts in entries}):
        if top == "__pycache__":
            continue
        source, link = base / top, dest / top
        children = {parts[1:] for parts in entries if parts[0] == top and len(parts) > 1}
        namespace = source.is_dir() and not (source / "__init__.py").exists()
        if namespace and not top.endswith((".dist-info", ".data")):
            link.mkdir(exist_ok=True)
            _link(source, children, link)
        elif not link.exists():
            link.symlink_to(source)


def _deps_dir(names: set[str], dest: Path) -> Path:
    dest.mkdir()
    for name in sorted(names):
        dist = importlib.metadata.distribution(name)
        base = Path(str(dist.locate_file("")))
        _link(base, {f.parts for f in dist.files or () if f.parts and f.parts[0] != ".."}, dest)
    return dest


def _probe(unpacked: Path, deps: Path) -> dict[str, Any]:
    # -I: no PYTHONPATH, user site or current directory; -S: no site-packages (and no
    # .pth files, so not the editable drafter either). sys.path is the stdlib plus
    # the two directories the probe prepends.
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", PROBE, str(unpacked), str(deps)],
        capture_output=True, text=True, timeout=180, cwd=deps,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert result["outside"] == []  # every module of ours came from the wheel
    return result


def test_wheel_imports_with_only_its_declared_dependencies(
    metadata: Message, unpacked: Path, tmp_path: Path
) -> None:
    deps = _deps_dir(_closure(_requirements(metadata).values()), tmp_path / "deps")
    missing = _probe(unpacked, deps)["missing"]
    # The client proper imports; only the worker-side modules miss, and only the
    # worker extra's packages.
    assert "verifier_client.client" not in missing and "verifier_client.aio" not in missing
    assert set(missing.values()) <= WORKER_IMPORTS, missing


def test_worker_extra_completes_the_package(
    metadata: Message, unpacked: Path, tmp_path: Path
) -> None:
    deps = _deps_dir(_closure(_requirements(metadata, "worker").values()), tmp_path / "deps")
    assert _probe(unpacked, deps)["missing"] == {}
