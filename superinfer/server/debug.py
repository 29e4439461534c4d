"""`GET /debug/engine` (only with --enable-debug-routes): KV ownership per tier and per
class, queue lengths, and the scheduler's invariant check. Runs on the engine thread
between steps, so it sees a consistent state. For tests; never expose it in production.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from superinfer.core.kv.errors import KVInvariantError
from superinfer.engine.llm_engine import LLMEngine


def engine_report(engine: LLMEngine) -> dict[str, Any]:
    scheduler = engine.scheduler
    kv = scheduler.kv
    blocks_by_class: Counter[str] = Counter()
    for request in scheduler.running:
        blocks_by_class[request.slo.slo_class or "none"] += kv.num_device_blocks_of(request)
    try:
        scheduler.check_invariants()
        invariants = "ok"
    except KVInvariantError as error:
        invariants = str(error)
    return {
        "num_unfinished": scheduler.num_unfinished_requests,
        "num_running": len(scheduler.running),
        "num_waiting": len(scheduler.waiting),
        "num_swapped": len(scheduler.swapped),
        "num_device_blocks": kv.device.num_blocks,
        "num_host_blocks": kv.host.num_blocks,
        "device_blocks_used": kv.device.num_used_blocks,
        "host_blocks_used": kv.host.num_used_blocks,
        "device_blocks_quarantined": kv.device.num_quarantined_blocks,
        "host_blocks_quarantined": kv.host.num_quarantined_blocks,
        "num_block_tables": len(kv.tables),
        "num_inflight_transfers": kv.num_inflight_transfers,
        "running_device_blocks_by_class": dict(blocks_by_class),
        "num_swap_outs": scheduler.stats.num_swap_outs,
        "num_preemptions": scheduler.stats.num_preemptions,
        "invariants": invariants,
    }
