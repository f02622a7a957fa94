"""Parses an engine's command line with the engine's own parser; run in the engine's
virtualenv by test_deploy_examples.py, so that the deployment examples name real flags.

    .venv-vllm/bin/python tests/engine_cli.py vllm < commands.json
    .venv-sglang/bin/python tests/engine_cli.py sglang < commands.json

stdin: a JSON list of ``{"argv": [...], "env": {...}}``, each a container's command
line (``vllm serve ...``, ``python3 -m sglang.launch_server ...``) and its environment.
stdout: a JSON list with, per command, the parsed settings the tests compare with the
manifest, or ``{"error": "..."}`` when the engine refuses it. Nothing starts: vLLM's
``serve`` parser and validation, SGLang's ``prepare_server_args`` and its
speculative-decoding hook, with our plug-in registered as SGLang's entry point would.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from typing import Any


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


def main() -> int:
    parse = PARSERS[sys.argv[1]]
    results = []
    for command in json.load(sys.stdin):
        saved = dict(os.environ)
        os.environ.update(command["env"])
        said = io.StringIO()  # argparse explains on stderr, then exits
        try:
            # stdout is the JSON answer's alone.
            with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
                results.append(parse(command["argv"]))
        except (SystemExit, ValueError) as err:
            results.append({"error": f"{type(err).__name__}: {err} {said.getvalue()[-2000:]}"})
        finally:
            os.environ.clear()
            os.environ.update(saved)
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
