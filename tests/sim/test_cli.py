from __future__ import annotations

import json

from superinfer.cli import build_parser, main


def test_simulate_writes_the_scripted_json(tmp_path, capsys):
    output = tmp_path / "out.json"
    code = main([
        "simulate", "--hardware", "gh200", "--model", "llama-3-8b", "--dataset", "synthetic",
        "--request-rate", "20", "--num-requests", "30", "--policy", "rotasched",
        "--ttft-slo-ms", "250", "--output", str(output),
    ])  # fmt: skip
    assert code == 0
    result = json.loads(output.read_text())
    for name in (
        "ttft_attainment",
        "tpot_attainment",
        "goodput",
        "output_throughput",
        "num_requests",
    ):
        assert name in result
    assert result["num_requests"] == 30 and len(result["records"]) == 30
    assert result["targets"]["ttft_ms"] == 250.0  # the flag overrides the profile's default
    assert result["config"]["hardware"] == "gh200" and result["workload"]["dataset"] == "synthetic"
    assert "TTFT attainment" in capsys.readouterr().out


def test_simulate_and_calibrate_are_listed_and_reject_unknown_profiles(capsys):
    parser = build_parser()
    args = parser.parse_args(["simulate", "--hardware", "h200", "--records", "none"])
    assert args.hardware == "h200" and args.pipeline is None  # None: the engine's default
    assert parser.parse_args(["calibrate", "--device", "cpu"]).repeats == 3
    assert main(["simulate", "--hardware", "tpu-v9", "--num-requests", "1"]) == 2
    assert "unknown hardware" in capsys.readouterr().err


def test_the_pipeline_defaults_as_in_the_engine_on_for_gpus_off_for_the_cpu():
    from types import SimpleNamespace

    from superinfer.sim.simulation import is_pipelined

    def system(hardware: str, pipeline: bool | None):
        return SimpleNamespace(config=SimpleNamespace(pipeline=pipeline),
                               hardware=SimpleNamespace(name=hardware))  # fmt: skip

    assert is_pipelined(system("gh200", None)) and not is_pipelined(system("cpu", None))
    assert is_pipelined(system("cpu", True)) and not is_pipelined(system("gh200", False))
