"""Small factories shared by the tests: requests, schedulers, and a fake model."""

from __future__ import annotations

import itertools
import zlib

from superinfer.config import CacheConfig, SchedulerConfig
from superinfer.core.factory import build_scheduler
from superinfer.core.outputs import ModelOutput, SchedulerOutput
from superinfer.core.request import Request
from superinfer.core.scheduler import Scheduler
from superinfer.sampling_params import SamplingParams

_ids = itertools.count()
EOS = 2


def _prompt_of(request_id: str, num_tokens: int) -> list[int]:
    """Token ids 100..1099 that depend only on the request id (not on the process's string
    hash seed) and differ between requests: a start and a stride from its CRC-32, so two
    requests share a prompt block only if both coincide (about 1 in a million pairs).
    Python's `hash` made prompts collide for about 1 in 1,000 pairs of ids, at random from
    run to run, and then prefix caching shared their blocks."""
    crc = zlib.crc32(request_id.encode())
    start, stride = crc % 1000, 1 + (crc // 1000) % 997
    return [100 + (start + stride * i) % 1000 for i in range(num_tokens)]


def make_request(
    num_prompt_tokens: int = 10,
    max_tokens: int = 8,
    arrival_time: float = 0.0,
    request_id: str | None = None,
    prompt_token_ids: list[int] | None = None,
    **params,
) -> Request:
    request_id = request_id if request_id is not None else f"r{next(_ids)}"
    prompt = prompt_token_ids or _prompt_of(request_id, num_prompt_tokens)
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=max_tokens, temperature=0.0, **params),
        arrival_time=arrival_time,
        eos_token_ids=(EOS,),
    )


def make_scheduler(
    policy: str = "fcfs-recompute",
    num_device_blocks: int = 64,
    num_host_blocks: int = 256,
    block_size: int = 4,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 64,
    max_model_len: int = 1024,
    enable_prefix_caching: bool = True,
    step_model=None,
    **config_options,
) -> Scheduler:
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        policy=policy,
        **config_options,
    )
    cache = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching)
    return build_scheduler(config, cache, num_device_blocks, num_host_blocks, step_model)


def fake_next_token(request_id: str, num_tokens: int) -> int:
    """A deterministic 'model': the next token depends only on the request and position."""
    return 1000 + (sum(map(ord, request_id)) * 31 + num_tokens * 7) % 5000


def fake_model_output(output: SchedulerOutput) -> ModelOutput:
    return ModelOutput(
        {
            seq.request_id: fake_next_token(
                seq.request_id, seq.num_context_tokens + seq.num_query_tokens
            )
            for seq in output.sequences
            if seq.is_sampling
        }
    )


def run_to_completion(
    scheduler: Scheduler,
    max_steps: int = 10_000,
    pending: list[int] | None = None,
    now: float = 0.0,
):
    """Drive the scheduler with the fake model, checking invariants after every step.

    Returns the list of SchedulerOutputs. Transfers are completed at the start of the
    next step, like an engine that polls once per step; `pending` carries the transfer ids
    of steps the caller ran by hand.
    """
    outputs = []
    pending = list(pending or [])
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests:
            break
        scheduler.complete_transfers(pending)
        pending = []
        out = scheduler.schedule(now)
        pending += [spec.transfer_id for spec in out.transfers]
        scheduler.update_from_output(out, fake_model_output(out), now)
        scheduler.check_invariants()
        outputs.append(out)
        now += 0.01
    scheduler.complete_transfers(pending)
    scheduler.check_invariants()
    assert not scheduler.has_unfinished_requests, "did not finish"
    return outputs


def run_pipelined(scheduler: Scheduler, max_steps: int = 10_000, abort_at: dict | None = None):
    """Drive the scheduler like the pipelined engine: step k+1 is scheduled while step k
    'computes' (between advance and fill), then pruned and launched. Invariants are checked
    at every stage. `abort_at` maps a step number to request ids aborted mid-flight."""
    pending: list[int] = []
    inflight = None  # (output, model output) of the step being computed
    now = 0.0
    for step in range(max_steps):
        if not scheduler.has_unfinished_requests and inflight is None:
            break
        scheduler.complete_transfers(pending)
        pending = []
        for request_id in (abort_at or {}).get(step, []):
            scheduler.abort_request(request_id, now)
        nxt = scheduler.schedule(now)
        pending += [spec.transfer_id for spec in nxt.transfers]
        scheduler.check_invariants()
        if inflight is not None:
            scheduler.fill(inflight[0], inflight[1], now)
            scheduler.check_invariants()
        scheduler.prune(nxt)
        assert all(t >= 0 for seq in nxt.sequences for t in seq.token_ids)
        model_output = fake_model_output(nxt)  # 'launch': the fake model needs only positions
        scheduler.advance(nxt)
        scheduler.check_invariants()
        inflight = (nxt, model_output) if nxt.sequences else None
        if inflight is None and nxt.is_empty:
            scheduler.abandon_step()
        now += 0.01
    scheduler.complete_transfers(pending)
    scheduler.check_invariants()
    assert not scheduler.has_unfinished_requests, "did not finish"


def run_roomy_and_tight(policy: str, make_workload, num_tight_blocks: int = 14):
    """Run the same workload on an ample and on a tight device pool; returns
    (roomy scheduler, tight scheduler, roomy requests, tight requests)."""
    roomy = make_scheduler(policy, num_device_blocks=256)
    tight = make_scheduler(policy, num_device_blocks=num_tight_blocks)
    reference, pressured = make_workload(), make_workload()
    for scheduler, requests in ((roomy, reference), (tight, pressured)):
        for r in requests:
            scheduler.add_request(r)
        run_to_completion(scheduler)
    return roomy, tight, reference, pressured
