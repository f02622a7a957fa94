"""The deployment examples' container command lines (deploy/), and the engines' own
parsers of them.

The main suite (test_deploy_examples.py) reads the manifests with these helpers; the
engine suites (make test-vllm, make test-sglang) parse the decode and prefill command
lines with the engine itself, in the process that has imported it already, so that the
examples name real flags. Nothing starts: vLLM's ``serve`` parser and validation,
SGLang's ``prepare_server_args`` and its speculative-decoding hook, with our plug-in
registered as SGLang's entry point would.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_DIRS = (ROOT / "deploy" / "sglang-pd", ROOT / "deploy" / "vllm-decode")
MANIFESTS = sorted(path for d in EXAMPLE_DIRS for path in d.glob("*.yaml"))


def objects(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def example_objects() -> list[dict[str, Any]]:
    return [obj for path in MANIFESTS for obj in objects(path)]


def deployment(component: str) -> dict[str, Any]:
    (found,) = [
        o for o in example_objects()
        if o["kind"] == "Deployment"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]  # fmt: skip
    return found


def container(component: str) -> dict[str, Any]:
    (found,) = deployment(component)["spec"]["template"]["spec"]["containers"]
    engine: dict[str, Any] = found
    return engine


def env_of(component: str) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(component).get("env", [])}


def command_line(component: str) -> list[str]:
    found = container(component)
    return [*found["command"], *found.get("args", [])]


def flag_value(argv: list[str], flag: str) -> str:
    """The value of ``--flag=value`` or ``--flag value`` (exactly once)."""
    values = [a.split("=", 1)[1] for a in argv if a.startswith(flag + "=")]
    values += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
    assert len(values) == 1, f"{flag}: {values}"
    return values[0]


def parse_vllm(argv: list[str]) -> dict[str, Any]:
    import vllm.entrypoints.cli.serve as serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if argv[:2] != ["vllm", "serve"]:
        raise ValueError(f"expected 'vllm serve ...', got {argv[:2]}")
    parser = FlexibleArgumentParser(prog="vllm")
    subparsers = parser.add_subparsers(dest="subparser")
    (command,) = serve.cmd_init()
    command.subparser_init(subparsers)
    args = parser.parse_args(argv[1:])
    command.validate(args)
    return {
        "model": args.model_tag,
        "port": args.port,
        "speculative_config": args.speculative_config,
        "additional_config": args.additional_config,
    }


def parse_sglang(argv: list[str]) -> dict[str, Any]:
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.arg_groups.speculative_hook import handle_speculative_decoding
    from sglang.srt.server_args import prepare_server_args

    from verifier_client.engines import sglang as plugin

    module = "sglang.launch_server"
    if module not in argv or argv[argv.index(module) - 1] != "-m":
        raise ValueError(f"expected 'python -m {module} ...', got {argv}")
    plugin.register()  # what the sglang.srt.plugins entry point does at launch
    args = prepare_server_args(argv[argv.index(module) + 1 :])
    handle_speculative_decoding(args)  # the registered algorithm's checks and defaults
    view = resolving_view(args)
    return {
        "model": view.model_path,
        "port": view.port,
        "enable_metrics": view.enable_metrics,
        "disaggregation_mode": view.disaggregation_mode,
        "speculative_algorithm": view.speculative_algorithm,
        "speculative_num_draft_tokens": view.speculative_num_draft_tokens,
    }


PARSERS = {"vllm": parse_vllm, "sglang": parse_sglang}


def engine_parse(engine: str, component: str) -> dict[str, Any]:
    """``component``'s container command line as the engine parses it, in its
    environment (the container's variables, ours removed); the engine's own explanation
    when it refuses it."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update({k: v for k, v in saved.items() if not k.startswith("SSSD_")})
    os.environ.update(env_of(component))
    said = io.StringIO()  # argparse explains on stderr, then exits
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            return PARSERS[engine](command_line(component))
    except (SystemExit, ValueError) as err:
        said_tail = said.getvalue()[-2000:]
        raise AssertionError(f"{component}: {type(err).__name__}: {err} {said_tail}") from err
    finally:
        os.environ.clear()
        os.environ.update(saved)
