"""Steps shaped by TBT promises: a gold request's next token is never late when the step
model allows it, bronze sits steps out but never past its own TBT, prompts progress in
chunks that fit, and a higher class displaces a lower one by rotation."""

from __future__ import annotations

import itertools

import pytest

from superinfer.core.request import RequestStatus
from superinfer.core.step_time import BatchShape, StepTimePredictor, step_seconds
from superinfer.slo import SLOTargets
from tests.factories import fake_model_output, make_request, make_scheduler

GOLD = SLOTargets(ttft_ms=500, tbt_ms=100, slo_class="gold")
BRONZE = SLOTargets(ttft_ms=5000, tbt_ms=1000, slo_class="bronze")
CLASSES = ("gold", "silver", "bronze")


class LinearCost(StepTimePredictor):
    """A made-up machine: a fixed cost per step, per sequence and per token."""

    def __init__(self, base_s: float = 0.03, seq_s: float = 0.006, token_s: float = 0.0005):
        self.base_s, self.seq_s, self.token_s = base_s, seq_s, token_s

    def forward_time(self, batch: BatchShape) -> float:
        return self.base_s + self.seq_s * batch.num_seqs + self.token_s * batch.num_tokens


def classed(request, targets: SLOTargets):
    request.slo = targets
    return request


def drive(scheduler, model, num_steps: int, now: float = 0.0, arrivals=()) -> float:
    """Run steps on a virtual clock that advances by the model's time of each batch;
    `arrivals` are (time, request) added once the clock passes their time."""
    pending: list[int] = []
    arrivals = sorted(arrivals, key=lambda a: a[0])
    for _ in range(num_steps):
        while arrivals and arrivals[0][0] <= now:
            scheduler.add_request(arrivals.pop(0)[1])
        if not scheduler.has_unfinished_requests and not arrivals:
            break
        scheduler.complete_transfers(pending)
        out = scheduler.schedule(now)
        pending = [spec.transfer_id for spec in out.transfers]
        now += step_seconds(model, BatchShape.of(out)) or 0.005
        scheduler.update_from_output(out, fake_model_output(out), now)
        scheduler.check_invariants()
    scheduler.complete_transfers(pending)  # the last step's copies land before the next call
    return now


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def gaps(request) -> list[float]:
    times = request.output_token_times
    return [b - a for a, b in itertools.pairwise(times)]


def gold_and_bronze(is_shaped: bool, model: StepTimePredictor, num_bronze: int = 12):
    s = make_scheduler("rotasched", num_device_blocks=400, max_num_seqs=32,
                       max_num_batched_tokens=256, step_model=model,
                       tbt_shaped_steps=is_shaped, class_order=CLASSES)  # fmt: skip
    gold = classed(make_request(8, max_tokens=60, request_id="gold"), GOLD)
    bronze = [classed(make_request(8, max_tokens=60, request_id=f"b{i}"), BRONZE)
              for i in range(num_bronze)]  # fmt: skip
    for request in [gold, *bronze]:
        s.add_request(request)
    return s, gold, bronze


def test_gold_keeps_its_tbt_while_bronze_sits_out_within_its_own():
    model = LinearCost()  # all 13 decoding together: 0.03 + 13 x 0.0065 = 0.115 s a step
    s, gold, bronze = gold_and_bronze(True, model)
    drive(s, model, 400)
    assert gold.status is RequestStatus.FINISHED_LENGTH
    assert max(gaps(gold)) <= GOLD.tbt_s
    for request in bronze:
        assert max(gaps(request)) <= BRONZE.tbt_s
    assert max(max(gaps(r)) for r in bronze) > 2 * max(gaps(gold))  # bronze did sit out


def test_without_shaping_the_same_batch_breaks_gold():
    model = LinearCost()
    s, gold, _ = gold_and_bronze(False, model)
    drive(s, model, 400)
    assert max(gaps(gold)) > GOLD.tbt_s  # what the shaped test protects against


def test_a_due_request_is_never_left_out_even_past_the_limit():
    model = LinearCost(seq_s=0.02)  # 5 gold decoding together already take 0.13 s
    s = make_scheduler("rotasched", tbt_shaped_steps=True, num_device_blocks=400, max_num_batched_tokens=256,
                       step_model=model, class_order=CLASSES)  # fmt: skip
    golds = [classed(make_request(8, max_tokens=20, request_id=f"g{i}"), GOLD) for i in range(5)]
    for g in golds:
        s.add_request(g)
    drive(s, model, 300)
    for g in golds:
        assert g.status is RequestStatus.FINISHED_LENGTH
        assert len(g.output_token_times) == 20
        assert max(gaps(g)) == pytest.approx(0.03 + 5 * 0.0205, rel=1e-6)  # in every step


def test_a_long_prompt_is_chunked_to_fit_gold_steps():
    model = LinearCost(token_s=0.001)
    s = make_scheduler("rotasched", tbt_shaped_steps=True, num_device_blocks=400, max_num_batched_tokens=512,
                       step_model=model, class_order=CLASSES)  # fmt: skip
    gold = classed(make_request(8, max_tokens=200, request_id="gold"), GOLD)
    s.add_request(gold)
    drive(s, model, 5)  # gold is decoding
    prompt = classed(make_request(400, max_tokens=4, request_id="bronze", arrival_time=0.0), BRONZE)
    s.add_request(prompt)
    drive(s, model, 300, now=gold.last_token_time)
    assert mean(gaps(gold)) <= GOLD.tbt_s  # TPOT is judged on the mean
    assert max(gaps(gold)) <= 2 * GOLD.tbt_s  # banked slack stretches a step, never more
    assert prompt.status is RequestStatus.FINISHED_LENGTH
    assert prompt.first_token_time <= BRONZE.ttft_s + gold.output_token_times[4]


def test_a_prompt_whose_ttft_is_at_risk_gets_its_whole_prefill():
    model = LinearCost(token_s=0.001)
    s = make_scheduler("rotasched", tbt_shaped_steps=True, num_device_blocks=400, max_num_batched_tokens=512,
                       step_model=model, class_order=CLASSES)  # fmt: skip
    s.add_request(classed(make_request(8, max_tokens=200, request_id="gold"), GOLD))
    now = drive(s, model, 5)
    urgent = classed(make_request(300, max_tokens=2, request_id="urgent", arrival_time=now), GOLD)
    s.add_request(urgent)
    out = s.schedule(now)
    counts = {q.request_id: q.num_query_tokens for q in out.sequences}
    # chunks that fit a 90 ms step (~50 tokens) would take 6 steps: past its 500 ms TTFT
    assert counts["urgent"] == 300 and counts["gold"] == 1


def test_gold_displaces_bronze_by_rotation_when_the_batch_is_full():
    s = make_scheduler("fcfs-recompute", num_device_blocks=400, max_num_seqs=3,
                       max_num_batched_tokens=256, class_order=CLASSES)  # fmt: skip
    bronze = [classed(make_request(8, max_tokens=50, request_id=f"b{i}"), BRONZE) for i in range(3)]
    for request in bronze:
        s.add_request(request)
    drive(s, LinearCost(), 3)
    gold = classed(make_request(8, max_tokens=5, request_id="gold", arrival_time=0.05), GOLD)
    s.add_request(gold)
    out = s.schedule(1.0)
    assert "gold" in {q.request_id for q in out.sequences}
    (victim_id,) = out.swapped_out_request_ids  # rotated out, not recomputed
    assert s.requests[victim_id].status is RequestStatus.SWAPPED
    assert not out.preempted_request_ids


def test_queue_admits_by_class_first():
    s = make_scheduler("fcfs-recompute", num_device_blocks=400, max_num_seqs=1,
                       max_num_batched_tokens=256, class_order=CLASSES)  # fmt: skip
    s.add_request(classed(make_request(8, request_id="bronze", arrival_time=0.0), BRONZE))
    s.add_request(classed(make_request(8, request_id="gold", arrival_time=0.1), GOLD))
    out = s.schedule(0.2)
    assert [q.request_id for q in out.sequences] == ["gold"]


def test_a_lower_class_prompt_at_risk_does_not_stretch_golds_steps():
    model = LinearCost(token_s=0.001)
    s = make_scheduler("rotasched", tbt_shaped_steps=True, num_device_blocks=400, max_num_batched_tokens=512,
                       step_model=model, class_order=CLASSES)  # fmt: skip
    s.add_request(classed(make_request(8, max_tokens=200, request_id="gold"), GOLD))
    now = drive(s, model, 5)
    late = SLOTargets(ttft_ms=100, tbt_ms=1000, slo_class="bronze")  # already at risk
    s.add_request(
        classed(make_request(300, max_tokens=2, request_id="late", arrival_time=now), late)
    )
    out = s.schedule(now)
    counts = {q.request_id: q.num_query_tokens for q in out.sequences}
    assert 16 <= counts["late"] < 300  # a chunk that fits gold's step, not the whole prompt


def test_gold_passes_the_rotasched_host_guard_while_bronze_runs():
    s = make_scheduler("rotasched", num_device_blocks=12, num_host_blocks=10, block_size=4,
                       max_num_seqs=8, max_num_batched_tokens=256, class_order=CLASSES)  # fmt: skip
    bronze = [
        classed(make_request(12, max_tokens=60, request_id=f"b{i}"), BRONZE) for i in range(5)
    ]
    for request in bronze:
        s.add_request(request)
    now = drive(s, LinearCost(), 30)
    assert s.kv.host.usage > 0.9 and any(r in s.running for r in bronze)  # the guard is on
    gold = classed(make_request(8, max_tokens=3, request_id="gold", arrival_time=now), GOLD)
    s.add_request(gold)
    drive(s, LinearCost(), 50, now=now)
    assert gold.first_token_time is not None


def test_a_shaped_step_carries_the_prompt_tokens_that_fit_beside_the_tightest_promise():
    """What admission prices the queue ahead at: the full budget until something decodes
    or when steps are not shaped; else the tokens that fit in gold's 90 ms step beside
    the decodes due in it (gold, and 10 bronze at 1 s that join one step in ten)."""
    model = LinearCost()
    s, _, _ = gold_and_bronze(True, model, num_bronze=10)
    assert s.num_prefill_tokens_per_step() == 256
    drive(s, model, 5)
    assert all(r.last_token_time is not None for r in s.running)
    # 0.03 + 0.006 x 3 sequences + 0.0005 x (2 decode + t prefill tokens) <= 0.09: t = 82
    assert s.num_prefill_tokens_per_step() in (81, 82)
    assert s.shaping_class() == "gold"  # gold's prompts keep whole prefills when at risk
    unshaped, _, _ = gold_and_bronze(False, model, num_bronze=10)
    drive(unshaped, model, 5)
    assert unshaped.num_prefill_tokens_per_step() == 256


SILVER = SLOTargets(ttft_ms=1000, tbt_ms=200, slo_class="silver")


def test_gold_decodes_that_fill_the_limit_do_not_starve_an_admitted_silver():
    """Six gold decodes take a whole 90 ms step between them; the silver admitted beside
    them still gets a token whenever its own is overdue: one row, not a broken promise."""
    model = LinearCost(seq_s=0.01)  # 6 gold: 0.03 + 6 x 0.0105 = 0.093 s
    s = make_scheduler("rotasched", tbt_shaped_steps=True, num_device_blocks=400,
                       max_num_batched_tokens=256, step_model=model, class_order=CLASSES)  # fmt: skip
    golds = [classed(make_request(8, max_tokens=80, request_id=f"g{i}"), GOLD) for i in range(6)]
    silver = classed(make_request(8, max_tokens=30, request_id="silver"), SILVER)
    for request in [*golds, silver]:
        s.add_request(request)
    drive(s, model, 200)
    assert silver.status is RequestStatus.FINISHED_LENGTH
    assert max(gaps(silver)) <= 2 * SILVER.tbt_s + 0.11  # its latest deadline, then a step
    assert mean(gaps(silver)) <= SILVER.tbt_s


def test_a_rotated_out_junior_comes_back_when_due_while_gold_prompts_keep_coming():
    """Gold prompts arrive one after another and take every step's token budget; a bronze
    rotated out to the host tier is still swapped back in for its token on time, ahead of
    the prompts: a queued decode costs a row, a prompt a chunk."""
    model = LinearCost(token_s=0.001)
    s = make_scheduler("rotasched", tbt_shaped_steps=True, num_device_blocks=400,
                       max_num_batched_tokens=64, step_model=model, class_order=CLASSES)  # fmt: skip
    gold = classed(make_request(8, max_tokens=400, request_id="gold"), GOLD)
    bronze = classed(make_request(8, max_tokens=12, request_id="bronze"), BRONZE)
    for request in (gold, bronze):
        s.add_request(request)
    now = drive(s, model, 3)
    assert s.rotate_out("bronze")
    arrivals = [(now + 0.1 * i, classed(make_request(120, max_tokens=2, request_id=f"p{i}",
                                                     arrival_time=now + 0.1 * i), GOLD))
                for i in range(60)]  # fmt: skip
    drive(s, model, 400, now=now, arrivals=arrivals)
    assert bronze.status is RequestStatus.FINISHED_LENGTH
    assert max(gaps(bronze)) <= 2 * BRONZE.tbt_s + 0.2


def test_a_running_bronze_prompt_leaves_the_step_budget_to_a_queued_gold_prompt():
    """Running requests are served first, but a bronze prompt part-way through its chunks
    does not make a gold prompt that arrived after it wait for them all."""
    s = make_scheduler("fcfs-recompute", num_device_blocks=400, max_num_batched_tokens=64,
                       class_order=CLASSES)  # fmt: skip
    bronze = classed(make_request(300, max_tokens=4, request_id="bronze"), BRONZE)
    s.add_request(bronze)
    now = drive(s, LinearCost(), 2)  # two 64-token chunks of its prompt
    assert bronze.num_computed_tokens == 128
    gold = classed(make_request(40, max_tokens=4, request_id="gold", arrival_time=now), GOLD)
    s.add_request(gold)
    out = s.schedule(now)
    counts = {q.request_id: q.num_query_tokens for q in out.sequences}
    assert counts == {"gold": 40, "bronze": 24}
    s.update_from_output(out, fake_model_output(out), now + 0.05)
    s.check_invariants()
    unranked = make_scheduler("fcfs-recompute", num_device_blocks=400, max_num_batched_tokens=64)
    unranked.add_request(make_request(300, max_tokens=4, request_id="first"))
    drive(unranked, LinearCost(), 1)
    unranked.add_request(make_request(40, max_tokens=4, request_id="second"))
    assert [q.request_id for q in unranked.schedule(1.0).sequences] == ["first"]  # no classes


def test_a_gold_prompt_that_needs_bronzes_blocks_still_goes_before_a_running_silver_prompt():
    """With the pool full of bronze decodes, a gold prompt fits only by displacing them:
    it still takes the step budget ahead of a silver prompt part-way through its chunks,
    and the bronze it displaces is rotated out, not recomputed."""
    silver_targets = SLOTargets(ttft_ms=1000, tbt_ms=200, slo_class="silver")
    s = make_scheduler("rotasched", num_device_blocks=40, max_num_batched_tokens=32,
                       class_order=CLASSES)  # fmt: skip
    bronze = [classed(make_request(20, max_tokens=50, request_id=f"b{i}"), BRONZE)
              for i in range(4)]  # fmt: skip
    for request in bronze:
        s.add_request(request)
    now = drive(s, LinearCost(), 6)  # all four prefilled and decoding
    assert all(r.is_prefill_done and r.status is RequestStatus.RUNNING for r in bronze)
    silver = classed(make_request(100, max_tokens=4, request_id="silver", arrival_time=now),
                     silver_targets)  # fmt: skip
    s.add_request(silver)
    now = drive(s, LinearCost(), 1, now)  # its first chunk
    assert 0 < silver.num_computed_tokens < 100
    gold = classed(make_request(40, max_tokens=4, request_id="gold", arrival_time=now), GOLD)
    s.add_request(gold)
    assert s.kv.num_blocks_for(gold.num_tokens) > s.kv.device.num_free_blocks
    out = s.schedule(now)
    counts = {q.request_id: q.num_query_tokens for q in out.sequences}
    assert counts.get("gold", 0) > 0 and counts.get("silver", 0) < 32 - 4  # the budget went to gold
    assert out.swapped_out_request_ids and not out.preempted_request_ids
    assert all(s.requests[i].slo.slo_class == "bronze" for i in out.swapped_out_request_ids)
    s.update_from_output(out, fake_model_output(out), now + 0.05)
    s.check_invariants()
    s.complete_transfers([spec.transfer_id for spec in out.transfers])  # the copies landed
    drive(s, LinearCost(), 200, now + 0.05)
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in [*bronze, silver, gold])
