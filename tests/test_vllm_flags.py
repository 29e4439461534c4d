"""vLLM's `vllm serve` flags: every row of docs/vllm-migration.md parses to the same
configuration as its superinfer spelling, or is refused; the YAML --config; byte sizes."""

from __future__ import annotations

import argparse
import os
import re
import shlex
from pathlib import Path

import pytest

from superinfer.cli import build_parser, main, serve_configs_from_args
from superinfer.vllm_flags import human_readable_int, with_config_file

DOC = Path(__file__).resolve().parents[1] / "docs" / "vllm-migration.md"
MODEL = "/models/a.gguf"


def migration_rows() -> list[tuple[str, str]]:
    """(vLLM argv, superinfer argv or 'refused') of each row of the table."""
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 3 and cells[0].startswith("`"):
            vllm = re.sub(r"\s*\(positional\)", "", cells[0]).strip("`")
            rows.append((vllm, cells[1].strip("`")))
    return rows


def configs(argv: str) -> tuple:
    args = build_parser().parse_args(["serve", *shlex.split(argv.replace("MODEL", MODEL))])
    return serve_configs_from_args(args)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.jinja").write_text("{{ messages[0]['content'] }}")
    return tmp_path


def test_the_table_covers_the_flags_the_issue_names():
    vllm_flags = {argv.split()[0] for argv, _ in migration_rows()}
    for flag in ("MODEL", "--gpu-memory-utilization", "--kv-cache-memory-bytes", "--swap-space",
                 "-tp", "--chat-template", "--generation-config", "--scheduling-policy",
                 "--served-model-name", "--pipeline-parallel-size"):  # fmt: skip
        assert flag in vllm_flags, flag
    assert {"--dtype"} <= vllm_flags and len(migration_rows()) >= 40


@pytest.mark.parametrize("vllm, superinfer", migration_rows())
def test_each_vllm_flag_means_its_superinfer_spelling(in_tmp, vllm, superinfer):
    if superinfer == "refused":
        with pytest.raises(ValueError):
            configs(vllm)
        return
    assert configs(vllm) == configs(superinfer)


def test_aliases_change_the_configuration():
    _, engine, _, cluster = configs("MODEL --swap-space 2 --scheduling-policy fcfs -dp 3")
    assert engine.model.model == MODEL and engine.cache.host_kv_gib == 2.0
    assert engine.scheduler.policy == "fcfs-recompute" and cluster.replicas == 3
    _, engine, _, _ = configs("--dtype half --kv-cache-memory-bytes 1.5g")
    assert engine.model.dtype == "float16" and engine.cache.kv_cache_memory_bytes == 1_500_000_000


def test_an_alias_and_its_superinfer_flag_must_agree():
    assert configs("--swap-space 1 --host-kv-gib 1")[1].cache.host_kv_gib == 1.0
    with pytest.raises(ValueError, match="disagree"):
        configs("--swap-space 1 --host-kv-gib 2")
    with pytest.raises(ValueError, match="disagree"):
        configs("/a.gguf --model /b.gguf")


def test_refusals_exit_2_with_one_line(capsys):
    assert main(["serve", "-tp", "4"]) == 2
    err = capsys.readouterr().err
    assert "--replicas" in err and "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize("text, value", [
    ("1024", 1024), ("4K", 4096), ("4k", 4000), ("2G", 2 * 2**30), ("2g", 2 * 10**9),
    ("25.6k", 25600), ("1.5m", 1_500_000), (" 3M ", 3 * 2**20),
])  # fmt: skip
def test_human_readable_int(text, value):
    assert human_readable_int(text) == value


@pytest.mark.parametrize("text", ["1.5G", "abc", "-1", "1GB", ""])
def test_human_readable_int_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        human_readable_int(text)


def test_config_file_gives_flags_the_command_line_overrides(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text(
        "model: /m/x.gguf\nport: 8001\nserved-model-name: [a, b]\n"
        "enable_prefix_caching: false\nswap-space: 3\ndisable-log-requests: false\n"
    )
    argv = with_config_file(build_parser(), ["serve", "--config", str(config), "--port", "9"])
    server, engine, _, _ = serve_configs_from_args(build_parser().parse_args(argv))
    assert server.port == 9 and server.served_model_name == ["a", "b"]
    assert engine.model.model == "/m/x.gguf" and engine.cache.host_kv_gib == 3.0
    assert engine.cache.enable_prefix_caching is False


def test_config_file_errors_are_clear(tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("no-such-flag: 1\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--config", str(config)])
    assert exit_info.value.code == 2 and "unknown flag 'no-such-flag'" in capsys.readouterr().err
    config.write_text("- a list\n")
    with pytest.raises(ValueError, match="mapping"):
        with_config_file(build_parser(), ["serve", f"--config={config}"])


def test_the_cli_leaves_hub_access_to_the_user(monkeypatch, capsys):
    """`superinfer serve org/name` downloads when the network allows (as vLLM does): the CLI
    does not turn on HF_HUB_OFFLINE itself; tests and CI set it."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert main(["serve", "-tp", "4"]) == 2
    capsys.readouterr()
    assert "HF_HUB_OFFLINE" not in os.environ
