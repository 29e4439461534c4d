"""Dataset loaders: Azure traces, random lengths, synthesized prompts, custom JSONL, and the
workload built from them."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from superinfer.bench.workload import build_workload
from superinfer.workload import datasets
from superinfer.workload.config import WorkloadConfig
from superinfer.workload.datasets import LengthLimits, TraceRow
from superinfer.workload.tokenizer import load_tokenizer

LIMITS = LengthLimits(max_prompt_tokens=1024, max_total_tokens=2048, min_tokens=4)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def test_azure_traces_are_packaged_whole():
    conv, code = datasets.load_azure_trace("azure-conv"), datasets.load_azure_trace("azure-code")
    assert (len(conv), len(code)) == (19_366, 8_819)  # the last line has no newline
    assert conv[0] == TraceRow(0.0, 374, 44)  # 2023-11-16 18:15:46.68, first line of the CSV
    assert conv[1].arrival_s == pytest.approx(50.9951690 - 46.6805900, abs=1e-5)
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(conv))
    assert 3000 < conv[-1].arrival_s < 3600  # one hour
    with pytest.raises(ValueError):
        datasets.load_azure_trace("azure-chat")


def test_replay_window_keeps_consecutive_requests_within_limits():
    trace = [TraceRow(0.0, 10, 10), TraceRow(1.0, 5000, 10), TraceRow(2.0, 20, 2),
             TraceRow(3.0, 30, 30), TraceRow(4.0, 40, 40)]  # fmt: skip
    rows, dropped = datasets.replay_window(trace, LIMITS, num_requests=2)
    assert rows == [trace[0], trace[3]] and dropped == 2  # too long, too short
    rows, dropped = datasets.replay_window(trace, LIMITS, start_s=0.5, end_s=3.5)
    assert rows == [trace[3]] and dropped == 2
    with pytest.raises(ValueError, match="only 3"):
        datasets.replay_window(trace, LIMITS, num_requests=4)


def test_sample_trace_is_seeded_and_filtered():
    trace = datasets.load_azure_trace("azure-code")
    a, dropped = datasets.sample_trace(trace, LIMITS, 50, seed=3)
    assert a == datasets.sample_trace(trace, LIMITS, 50, seed=3)[0]
    assert a != datasets.sample_trace(trace, LIMITS, 50, seed=4)[0]
    assert all(datasets.within_limits(r.num_prompt_tokens, r.num_output_tokens, LIMITS) for r in a)
    assert dropped > 0  # the coding trace has many prompts over 1,024 tokens


def test_random_lengths():
    assert datasets.random_lengths(3, 100, 10) == [(100, 10)] * 3
    lengths = datasets.random_lengths(500, 100, 10, range_ratio=0.5, seed=1)
    assert lengths == datasets.random_lengths(500, 100, 10, range_ratio=0.5, seed=1)
    prompts, outputs = zip(*lengths)
    assert (min(prompts), max(prompts)) == (50, 150) and (min(outputs), max(outputs)) == (5, 15)
    with pytest.raises(ValueError):
        datasets.random_lengths(3, 100, 10, range_ratio=1.0)


@pytest.mark.parametrize("num_tokens", [1, 17, 200])
def test_synthesized_prompts_have_the_asked_length(tokenizer, num_tokens):
    import random

    text, count = datasets.synthesize_prompt(tokenizer, num_tokens, random.Random(num_tokens))
    assert count == len(tokenizer(text)["input_ids"])
    assert count == pytest.approx(num_tokens, abs=max(1, num_tokens // 50))


def test_custom_jsonl(tmp_path, tokenizer):
    path = tmp_path / "prompts.jsonl"
    lines = [{"prompt": "Tell me about the sea.", "output_tokens": 12},
             {"prompt": "Hi"},  # too short a prompt for min_tokens=4: dropped
             {"prompt": "Write a haiku about autumn leaves, please."}]  # fmt: skip
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    requests, dropped = datasets.load_custom(str(path), tokenizer, None, 50, LIMITS)
    assert dropped == 1
    assert [(r.prompt, r.num_output_tokens) for r in requests] == [
        (lines[0]["prompt"], 12), (lines[2]["prompt"], 50)]  # fmt: skip
    assert requests[0].num_prompt_tokens == len(tokenizer(lines[0]["prompt"])["input_ids"])
    with pytest.raises(ValueError, match="only 2"):
        datasets.load_custom(str(path), tokenizer, 3, 50, LIMITS)
    path.write_text('{"text": "no prompt"}\n')
    with pytest.raises(TypeError):
        datasets.load_custom(str(path), tokenizer, None, 50, LIMITS)


def test_workload_is_reproducible_and_targets_follow_the_mix(tokenizer):
    config = WorkloadConfig(dataset_name="random", num_prompts=10, request_rate=4.0, seed=2,
                            random_input_len=32, random_output_len=8,
                            slo_classes="gold=0.3,bronze=0.7", tbt_slo_ms=40)  # fmt: skip
    a, b = build_workload(config, tokenizer), build_workload(config, tokenizer)
    assert [(s.prompt, s.arrival_s, s.targets) for s in a.specs] == [
        (s.prompt, s.arrival_s, s.targets) for s in b.specs]  # fmt: skip
    assert [s.targets.slo_class for s in a.specs].count("gold") == 3
    assert {s.targets.tbt_ms for s in a.specs} == {40}
    assert all(s.max_tokens == 8 for s in a.specs)


def test_workload_replays_the_azure_trace(tokenizer):
    config = WorkloadConfig(dataset_name="azure-conv", num_prompts=None, duration=30.0,
                            trace_replay=True, time_scale=0.5, max_output_tokens=20)  # fmt: skip
    work = build_workload(config, tokenizer)
    rows, dropped = datasets.replay_window(datasets.load_azure_trace("azure-conv"), LIMITS,
                                           end_s=60.0)  # fmt: skip
    assert len(work.specs) == len(rows) and work.num_dropped == dropped
    assert [s.arrival_s for s in work.specs] == pytest.approx([r.arrival_s * 0.5 for r in rows])
    assert all(s.arrival_s <= 30.0 for s in work.specs)
    assert [s.max_tokens for s in work.specs] == [min(r.num_output_tokens, 20) for r in rows]
    assert [s.num_prompt_tokens for s in work.specs] == pytest.approx(
        [r.num_prompt_tokens for r in rows], abs=8
    )


def test_multi_turn_sessions_resend_their_history(tokenizer):
    sessions = datasets.sample_sharegpt_sessions(tokenizer, 5, seed=3, limits=LIMITS)
    assert len(sessions) == 5
    for session in sessions:
        assert len(session.turns) >= 2
        for before, after in itertools.pairwise(session.turns):
            assert after.prompt.startswith(before.prompt + "\n\n")
            assert after.num_prompt_tokens > before.num_prompt_tokens
        assert all(t.num_prompt_tokens <= 1024 and t.num_output_tokens >= 4 for t in session.turns)


def test_multi_turn_workload_chains_turns_and_keeps_the_rate(tokenizer):
    config = WorkloadConfig(dataset_name="sharegpt-multiturn", num_prompts=None, duration=120.0,
                            request_rate=2.0, turn_gap=7.0, seed=1)  # fmt: skip
    work = build_workload(config, tokenizer)
    times = [s.arrival_s for s in work.specs]
    assert times == sorted(times) and times[0] >= 0
    assert 120 <= len(times) <= 360  # Poisson conversations: 240 turns expected
    by_turn = {s.turn: s for s in work.specs}
    for spec in work.specs:
        conversation, index = spec.turn
        if index == 0:  # sent at its arrival, within the run
            assert spec.think_s is None and spec.arrival_s < 120.0
            continue
        before = by_turn[conversation, index - 1]  # every turn of a conversation is sent
        assert spec.think_s == 7.0 and spec.arrival_s == pytest.approx(before.arrival_s + 7.0)
        assert spec.prompt.startswith(before.prompt + "\n\n")
        assert spec.turns[: len(before.turns)] == before.turns
    again = build_workload(config, tokenizer)
    assert [(s.prompt, s.arrival_s) for s in again.specs] == [
        (s.prompt, s.arrival_s) for s in work.specs]  # fmt: skip


def test_workload_config_checks():
    with pytest.raises(ValueError):
        WorkloadConfig(dataset_name="sharegpt", trace_replay=True)
    with pytest.raises(ValueError):
        WorkloadConfig(dataset_name="custom")
    with pytest.raises(ValueError):
        WorkloadConfig(dataset_name="nope")
    assert math.isinf(WorkloadConfig().request_rate)
