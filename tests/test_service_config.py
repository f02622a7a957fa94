"""`drafter serve` settings (flags over DRAFTER_* variables over defaults) and the
request table's TTL and LRU bounds, without a network."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest
from service_support import parsed_config

from drafter_service.engine.request_table import (
    NODE_BYTES_MAX,
    PYTHON_STATE_BYTES,
    HeldRequest,
    RequestTable,
    StateCost,
)
from drafter_service.service.open_catalog import resolve_tokenizer
from drafter_service.service.setting_values import DEFAULT_VOCAB_SIZE
from drafter_service.service.settings import ServeConfig


def test_defaults_need_no_configuration(tmp_path: Path) -> None:
    """Nothing set: every value has a default, the vocabulary the embedded Llama-3 one
    (tests/test_service_default.py runs bare `drafter serve` for real)."""
    config = parsed_config([], {})
    assert config.host == "127.0.0.1" and config.port == 50051
    assert config.vocab_size is None and config.tokenizer is None  # resolved at open:
    resolved = resolve_tokenizer(config.model_copy(update={"data_dir": tmp_path / "drafter-data"}))
    assert resolved.vocab_size == DEFAULT_VOCAB_SIZE == 128256
    assert config.data_dir == Path("drafter-data") and config.snapshot is None
    assert config.draft_threads == (os.cpu_count() or 1) and config.max_budget == 256
    assert config.max_message_bytes == 64 << 20 and config.max_inflight_calls == 64
    assert config.inline_max_work == 256
    assert config.live_policy().store == "output"


def test_flag_wins_over_environment_over_default() -> None:
    environ = {
        "DRAFTER_PORT": "7000",
        "DRAFTER_MAX_BUDGET": "64",
        "DRAFTER_STORE": "prompt+output",
        "DRAFTER_DATASTORES": "code=/srv/code, chat=/srv/chat",
        "DRAFTER_KEEPALIVE_PERMIT_WITHOUT_CALLS": "false",
        "DRAFTER_MAX_RESIDENT_BYTES": "",
        "DRAFTER_REQUEST_TTL_S": "2.5",
    }
    config = parsed_config(["--port", "0", "--datastore", "x=/x"], environ)
    assert config.port == 0 and config.max_budget == 64 and config.store == "prompt+output"
    assert config.datastores == (("x", Path("/x")),)
    assert config.keepalive_permit_without_calls is False and config.request_ttl_s == 2.5
    assert config.max_resident_bytes is None
    config = parsed_config([], environ)
    assert config.port == 7000
    assert config.datastores == (("code", Path("/srv/code")), ("chat", Path("/srv/chat")))


def test_a_variable_is_matched_in_any_case_and_unset_when_empty() -> None:
    environ = {"drafter_port": "7002", "DRAFTER_MAX_BUDGET": "", "DRAFTER_NOT_A_SETTING": "1"}
    config = parsed_config([], environ)
    assert config.port == 7002 and config.max_budget == 256


def test_every_setting_has_a_flag_and_a_variable() -> None:
    parser = argparse.ArgumentParser()
    ServeConfig.add_arguments(parser)
    help_text = parser.format_help()
    for name in ServeConfig.model_fields:
        flag = "--datastore" if name == "datastores" else "--" + name.replace("_", "-")
        assert flag in parser._option_string_actions, flag
        assert f"DRAFTER_{name.upper()}" in help_text.replace("\n", " ").replace("  ", " ")


@pytest.mark.parametrize(
    ("args", "environ", "message"),
    [
        (["--port", "http"], {}, "--port: bad value 'http'"),
        ([], {"DRAFTER_VOCAB_SIZE": "big"}, "DRAFTER_VOCAB_SIZE: bad value 'big'"),
        (["--datastore", "nodir"], {}, "'nodir' is not NAME=DIR"),
        (["--datastore", "default=/x"], {}, "'default' is invalid, reserved"),
        (["--datastore", "a=/x", "--datastore", "a=/y"], {}, "'a' is invalid"),
        (["--port", "70000"], {}, "ServeConfig.port = 70000"),
        (["--max-budget", "0"], {}, "ServeConfig.max_budget = 0"),
        ([], {"DRAFTER_INLINE_MAX_WORK": "-1"}, "ServeConfig.inline_max_work = -1"),
        (["--store", "everything"], {}, "LivePolicy.store = 'everything'"),
        (["--keepalive-permit-without-calls", "maybe"], {}, "'maybe' is not a boolean"),
        (["--draft-config", "smoothing=1"], {}, "'smoothing' is not a DraftConfig field"),
        (["--draft-config", "input_max_prefix=two"], {}, "input_max_prefix = 'two' is not a int"),
        (["--draft-config", "input_weight=-1"], {}, "input_weight = -1 must be in [0, 1000000]"),
        (["--draft-config", "max_budget=8"], {}, "set max_budget with --max-budget"),
        (["--draft-config", "nokey"], {}, "'nokey' is not KEY=VALUE"),
    ],
)
def test_bad_settings_name_the_flag_or_variable(
    args: list[str], environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError) as info:
        parsed_config(args, environ)
    assert message in str(info.value)


def test_a_settings_file_is_below_variables_and_flags(tmp_path: Path) -> None:
    settings = tmp_path / "drafter.toml"
    settings.write_text(
        'port = 7001\nmax_budget = 32\nlog_level = "debug"\n'
        'datastores = {code = "/srv/code"}\ndraft_config = ["input_weight=0.5"]\n'
        "keepalive_permit_without_calls = false\n"
    )
    config = parsed_config(["--config-file", str(settings)], {})
    assert config.port == 7001 and config.max_budget == 32 and config.log_level == "debug"
    assert config.datastores == (("code", Path("/srv/code")),)
    assert config.draft_settings().input_weight == 0.5
    assert config.keepalive_permit_without_calls is False
    environ = {"DRAFTER_CONFIG_FILE": str(settings), "DRAFTER_MAX_BUDGET": "16"}
    config = parsed_config(["--port", "0"], environ)
    assert config.port == 0 and config.max_budget == 16 and config.log_level == "debug"


def test_a_bad_settings_file_names_the_file_and_the_key(tmp_path: Path) -> None:
    settings = tmp_path / "drafter.toml"
    settings.write_text("port = 70000\nmax_budgte = 8\n")
    with pytest.raises(ValueError) as info:
        parsed_config(["--config-file", str(settings)], {})
    assert f"{settings}: port: bad value 70000: ServeConfig.port = 70000" in str(info.value)
    assert f"{settings}: max_budgte: not a setting of drafter serve" in str(info.value)
    settings.write_text("bootstrap_peers = [1, 2]\n")  # not strings: named all the same
    with pytest.raises(ValueError, match=r"bootstrap_peers: bad value '1,2': '1' is not an"):
        parsed_config(["--config-file", str(settings)], {})
    settings.write_text("port = \n")
    with pytest.raises(ValueError, match="--config-file: cannot read"):
        parsed_config(["--config-file", str(settings)], {})
    missing = {"DRAFTER_CONFIG_FILE": str(tmp_path / "none.toml")}
    with pytest.raises(ValueError, match=r"DRAFTER_CONFIG_FILE: .*none\.toml' is not a file"):
        parsed_config([], missing)


def test_table_expires_idle_states_in_use_order() -> None:
    table = RequestTable(ttl_s=10, max_states=100)
    for i, rid in enumerate("abc"):
        table.start(rid, "default", 1, 1, float(i))
    table.append("a", 0, 5.0)  # a is now the most recent
    assert [rid for rid, _ in table.expire(11.5)] == ["b"]  # idle 10.5 s > 10
    assert [rid for rid, _ in table.expire(100.0)] == ["c", "a"]
    assert len(table) == 0 and table.bytes == 0


def test_table_trims_the_least_recent_but_never_the_current_call() -> None:
    table = RequestTable(ttl_s=10, max_states=2)
    for rid in "abcd":
        table.start(rid, "default", 1, 1, 0.0)
    assert [rid for rid, _ in table.trim(keep=["a"])] == ["b", "c"]
    assert [rid for rid in "abcd" if table.get(rid)] == ["a", "d"]
    table.start("e", "default", 1, 1, 0.0)
    assert [rid for rid, _ in table.trim(keep=["a", "d", "e"])] == []  # the call may overflow
    assert len(table) == 3


def test_table_counts_the_bound_until_measured_then_what_was_measured() -> None:
    cost = StateCost(max_depth=4, vocab_size=640)
    table = RequestTable(ttl_s=10, max_states=100, max_bytes=1 << 30, cost=cost)
    a, reserved = table.start("a", "default", 100, 10, 0.0)
    assert reserved == cost.worst(100) == cost.fixed + 100 * (4 * NODE_BYTES_MAX + 8)
    assert table.bytes == a.bytes == reserved
    table.measured("a", a, reserved, held=5_000, headroom=20)  # what the drafter reported
    assert a.bytes == table.bytes == 5_000 + PYTHON_STATE_BYTES and a.reserved == 0
    assert table.append("a", 20, 0.0) == 0  # fits its headroom: nothing can be allocated
    measured = a.bytes
    assert table.append("a", 1, 0.0) == cost.worst(121) - measured > 0  # may reallocate: the bound
    assert table.bytes == cost.worst(121) and a.length == 121
    table.measured("a", a, 0, held=5_000, headroom=0)  # the first call ran; one is pending
    assert a.bytes == 5_000 + PYTHON_STATE_BYTES + a.reserved and a.headroom == 0
    table.measured("a", a, a.reserved, held=9_000, headroom=7)
    assert table.bytes == a.bytes == 9_000 + PYTHON_STATE_BYTES and a.headroom == 7
    table.measured("a", HeldRequest("default", 1, 1, 0.0), 0, held=1, headroom=0)  # stale
    assert table.bytes == a.bytes
    b, _ = table.start("b", "default", 1, 1, 0.0)
    table.max_bytes = table.bytes - 1  # over budget by one byte: the oldest goes
    assert [rid for rid, _ in table.trim(keep=["b"])] == ["a"]
    assert table.bytes == b.bytes and table.evicted["bytes"] == 1
    assert table.pop("b") is b and table.bytes == 0


def test_draft_config_reaches_the_drafting_parameters() -> None:
    config = parsed_config(
        ["--draft-config", "datastore_smoothing=0", "--draft-config", "input_max_prefix=6",
         "--max-budget", "64"],
        {"DRAFTER_DRAFT_CONFIG": "input_weight=0.5"},
    )  # fmt: skip
    settings = config.draft_settings()
    assert settings.datastore_smoothing == 0.0 and settings.input_max_prefix == 6
    assert settings.max_budget == 64 and settings.input_weight == 0.6  # the flag wins
    from_env = parsed_config([], {"DRAFTER_DRAFT_CONFIG": "input_weight=0.5"})
    assert from_env.draft_settings().input_weight == 0.5
