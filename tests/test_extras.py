"""The library install is the core alone; the service, builder, worker and benchmark
dependencies come with their extras (issue 30, item 5), and each console script names
the extra it needs when it is missing. Checked in subprocesses where the other extras'
packages cannot be imported (``sys.modules[name] = None`` makes ``import name`` fail).
The wheel installs packages of this project's names alone (no top-level ``benchmarks``)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from wheel_build import build_wheel

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]

# What the extras bring; none of it may be needed by the library.
NOT_CORE = ("grpc", "google.protobuf", "grpc_health", "grpc_reflection", "fastapi",
            "starlette", "uvicorn", "pydantic", "prometheus_client",
            "redis", "pyarrow", "tokenizers", "jinja2", "tqdm", "torch", "transformers",
            "sklearn", "matplotlib")  # fmt: skip


def _run_without(
    modules: tuple[str, ...], code: str, *args: str
) -> subprocess.CompletedProcess[str]:
    blocked = "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
    program = f"import sys\n{blocked}{code}"
    return subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)  # fmt: skip


def test_the_library_install_depends_on_numpy_alone() -> None:
    assert [Requirement(r).name for r in PROJECT["dependencies"]] == ["numpy"]
    extras = PROJECT["optional-dependencies"]
    assert {"builder", "service", "worker", "train", "bench", "test"} <= set(extras)
    names = {e: {Requirement(r).name for r in extras[e]} for e in extras}
    assert {"grpcio", "fastapi", "uvicorn", "redis"} <= names["service"]
    assert "pyarrow" in names["builder"] and "pyarrow" not in names["worker"]


# The wheel's top-level names: our packages, each named for this project, and nothing
# generic at the top of site-packages (the benchmarks were `benchmarks`, the stubs `sssd`).
WHEEL_PACKAGES = {"drafter_service", "verifier_client", "datastore_builder", "drafter_bench",
                  "sssd_drafter"}  # fmt: skip
NOT_TOP_LEVEL = {"benchmarks", "sssd", "tests"}


def test_the_wheel_packages_only_names_of_its_own() -> None:
    packages = PYPROJECT["tool"]["scikit-build"]["wheel"]["packages"]
    assert set(packages) == WHEEL_PACKAGES
    for package in packages:
        assert (ROOT / package / "__init__.py").is_file(), package
    # benchmarks/ is data (results, device scripts): no module there to be packaged.
    assert not list((ROOT / "benchmarks").rglob("*.py"))
    assert PROJECT["scripts"]["drafter-bench"] == "drafter_service.console:drafter_bench"


@pytest.mark.system
def test_the_built_wheel_has_no_generic_top_level_name(tmp_path: Path) -> None:
    """The real wheel, built offline from this checkout."""
    wheel = build_wheel(ROOT, tmp_path, 900)
    with zipfile.ZipFile(wheel) as archive:
        top = {name.split("/")[0] for name in archive.namelist() if ".dist-info/" not in name}
    assert top == WHEEL_PACKAGES
    assert not top & NOT_TOP_LEVEL


LIBRARY = """
from drafter_service import Datastore, Drafter
from drafter_service.live.live_datastore import LiveDatastore, LivePolicy
from drafter_service.snapshot.store import TokenizerIdentity

store = Datastore.from_documents([[5, 6, 7, 8, 9, 5, 6, 7]], vocab_size=100)
drafter = Drafter(vocab_size=100, datastore=store)
drafter.start("r", [1, 5, 6])
tree = drafter.speculate(["r"], [[]], budgets=8).tree(0)
assert list(tree.tokens[:2]) == [7, 8], tree.tokens
live = LiveDatastore(sys.argv[1], TokenizerIdentity("t", 100, ""), LivePolicy(),
                     on_swap=drafter.set_datastore)
live.ingest_generation([1, 2, 3], [4, 5, 6, 7])
live.rebuild()
live.snapshot()
live.close()
print("ok")
"""


def test_drafting_and_the_live_datastore_need_only_the_core(tmp_path: Path) -> None:
    done = _run_without(NOT_CORE, LIBRARY, str(tmp_path / "live"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok"]


@pytest.mark.parametrize(
    ("script", "argv", "blocked", "extra"),
    [
        ("drafter", ["serve", "--port", "0"], ("grpc",), "service"),
        ("datastore_builder", ["build", "--help"], ("tqdm",), "builder"),
        ("drafter_bench", ["replay", "--help"], ("grpc",), "bench"),
    ],
)
def test_a_console_script_names_the_extra_it_misses(
    script: str, argv: list[str], blocked: tuple[str, ...], extra: str
) -> None:
    code = (f"from drafter_service import console\nsys.argv[1:] = {argv!r}\n"
            f"sys.exit(console.{script}())")  # fmt: skip
    done = _run_without(blocked, code)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"needs the '{extra}' extra; '{blocked[0]}' is not installed" in done.stderr
    assert f"pip install 'sssd-drafter[{extra}]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_drafter_worker_names_the_worker_extra() -> None:
    code = ("from verifier_client.reference_worker.worker_cli import main\n"
            "sys.exit(main(['--tiny', 'llama', '--prompts', 'none.jsonl']))")  # fmt: skip
    done = _run_without(("torch",), code)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "needs the 'worker' extra; 'torch' is not installed" in done.stderr
    assert "Traceback" not in done.stderr
