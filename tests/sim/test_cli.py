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


def test_every_scheduler_and_cache_knob_is_a_simulate_flag_with_the_simulators_defaults():
    import dataclasses

    from superinfer.config import CacheConfig, SchedulerConfig

    args = vars(build_parser().parse_args(["simulate"]))
    for config_type in (SchedulerConfig, CacheConfig):
        for f in dataclasses.fields(config_type):
            assert (f.name in args) == f.metadata.get("is_cli", True), f.name
    assert (args["max_num_seqs"], args["max_num_batched_tokens"]) == (256, 16384)
    assert args["max_model_len"] is args["host_kv_gib"] is args["device_kv_gib"] is None
    assert (args["policy"], args["block_size"]) == ("rotasched", 16)
    assert args["transfer_mode"] == "duplex" and args["pipeline"] is None


def test_simulate_flags_reach_the_scheduler_and_classes_their_reservations(tmp_path):
    slo = tmp_path / "classes.json"
    slo.write_text(json.dumps({"classes": [
        {"name": "gold", "ttft_ms": 300, "tbt_ms": 60, "reserved_kv_share": 0.3},
        {"name": "bronze", "ttft_ms": 3000, "tbt_ms": 500},
    ]}))  # fmt: skip
    output = tmp_path / "out.json"
    code = main([
        "simulate", "--dataset", "synthetic", "--request-rate", "20", "--num-requests", "20",
        "--policy", "ddps", "--ddps-margin", "3", "--min-residency-tokens", "9",
        "--num-host-blocks", "5000", "--slo-config", str(slo), "--slo-classes",
        "gold=0.25,bronze=0.75", "--output", str(output),
    ])  # fmt: skip
    assert code == 0
    result = json.loads(output.read_text())
    config = result["config"]
    assert (config["policy"], config["ddps_margin"]) == ("ddps", 3.0)
    assert config["min_residency_tokens"] == 9
    assert config["class_reservations"] == {"gold": [0.3, 0.0]}
    assert result["system"]["num_host_blocks"] == 5000
    assert result["classes"]["gold"]["num_requests"] == 5
    assert result["classes"]["gold"]["targets"]["ttft_ms"] == 300
    assert sum(r["slo_class"] == "gold" for r in result["records"]) == 5
    assert main(["simulate", "--num-requests", "2", "--slo-classes", "tin=1"]) == 2
