"""A simulated run as result JSON: the benchmark's fields, computed from per-request
records by the project's one metrics module (`superinfer.slo.metrics`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from superinfer.core.request import Request, RequestStatus
from superinfer.sim.simulation import SimRun
from superinfer.slo.metrics import (
    ABORTED,
    FINISHED,
    REJECTED,
    RequestRecord,
    SLOReport,
    attainment,
    percentile,
    run_duration_s,
    slo_report,
    targets_dict,
)


def to_record(request: Request, outcome: str, rejection_reason: str | None = None) -> RequestRecord:
    times = tuple(request.output_token_times)
    return RequestRecord(
        request_id=request.request_id, targets=request.slo, arrival_time=request.arrival_time,
        token_times=times, finished_time=request.finished_time if outcome == FINISHED else None,
        first_scheduled_time=request.first_scheduled_time, outcome=outcome,
        num_prompt_tokens=request.num_prompt_tokens, num_output_tokens=len(times),
        finish_reason=request.status.finish_reason, num_preemptions=request.num_preemptions,
        num_rotations=request.num_swap_outs, rejection_reason=rejection_reason,
    )  # fmt: skip


def records_of(run: SimRun) -> list[RequestRecord]:
    """One record per request of the workload: finished, aborted or rejected."""
    max_len = run.system.max_model_len
    rejected = {r.request_id for r in run.rejected}
    admission = run.engine.admission
    reasons = admission.reasons if admission is not None else {}
    records = []
    for request in run.requests:
        if request.request_id in rejected:
            reason = "prompt_too_long" if request.num_prompt_tokens >= max_len else reasons.get(
                request.request_id, "slo_infeasible")  # fmt: skip
            records.append(to_record(request, REJECTED, reason))
        elif request.status is RequestStatus.FINISHED_ABORTED or not request.is_finished:
            records.append(to_record(request, ABORTED))
        else:
            records.append(to_record(request, FINISHED))
    return records


def latency_summary(reports: Sequence[SLOReport]) -> dict[str, float | None]:
    """p50/p90/p99/mean TTFT and TPOT (ms) over the requests that have them."""
    summary: dict[str, float | None] = {}
    for name in ("ttft", "tpot"):
        values = [getattr(r, f"{name}_ms") for r in reports]
        values = [v for v in values if v is not None]
        summary[f"p50_{name}_ms"] = statistics.median(values) if values else None
        summary[f"p90_{name}_ms"] = percentile(values, 90)
        summary[f"p99_{name}_ms"] = percentile(values, 99)
        summary[f"mean_{name}_ms"] = statistics.fmean(values) if values else None
    return summary


def summarize(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Attainment, goodput, throughput and latency percentiles of a set of records."""
    reports = [slo_report(r) for r in records]
    duration = run_duration_s(records)
    att = attainment(reports, duration)
    num_output = sum(r.num_tokens_out for r in records if r.outcome == FINISHED)
    return {
        "num_requests": att.num_requests, "num_finished": att.num_finished,
        "num_rejected": att.num_rejected, "num_aborted": att.num_aborted,
        "ttft_attainment": att.ttft, "tpot_attainment": att.tpot,
        "tbt_token_attainment": att.tbt_token, "slo_attainment": att.all_met,
        "precision": att.precision, "goodput": att.goodput_rps, "output_throughput": num_output / duration if duration else None,
        "request_throughput": att.num_finished / duration if duration else None,
        "duration_s": duration, **latency_summary(reports),
    }  # fmt: skip


def request_dict(record: RequestRecord, is_token_times: bool) -> dict[str, Any]:
    report = slo_report(record).to_dict()
    row = {
        "request_id": record.request_id, "arrival_time": round(record.arrival_time, 6),
        "num_prompt_tokens": record.num_prompt_tokens, "num_output_tokens": record.num_tokens_out,
        "outcome": record.outcome,
        **{k: report[k] for k in ("ttft_ms", "tpot_ms", "max_tbt_ms", "e2e_ms", "queue_ms",
                                  "ttft_met", "tpot_met", "preemptions", "rotations")},
    }  # fmt: skip
    if record.rejection_reason:
        row["rejection_reason"] = record.rejection_reason
    if record.targets.slo_class is not None:
        row["slo_class"] = record.targets.slo_class
    if is_token_times:
        row["token_times"] = [round(t, 6) for t in record.token_times]
    return row


def run_stats(run: SimRun) -> dict[str, Any]:
    engine = run.engine
    sched, kv, transfer, runner = (
        engine.scheduler.stats,
        engine.scheduler.kv.stats,
        engine.transfer.stats,
        engine.runner.counters,
    )
    return {
        "num_steps": runner.num_steps,
        "mean_step_ms": 1000 * runner.busy_s / runner.num_steps if runner.num_steps else None,
        "busy_s": runner.busy_s, "num_preemptions": sched.num_preemptions,
        "num_swap_outs": sched.num_swap_outs, "num_swap_ins": sched.num_swap_ins,
        "num_proactive_rotations": sched.num_proactive_rotations,
        "num_writeback_blocks": kv.num_writeback_blocks,
        "kv_gb_d2h": transfer.d2h.num_bytes / 1e9, "kv_gb_h2d": transfer.h2d.num_bytes / 1e9,
        "link_busy_s_d2h": transfer.d2h.seconds, "link_busy_s_h2d": transfer.h2d.seconds,
        "num_copy_calls": transfer.d2h.num_copy_calls + transfer.h2d.num_copy_calls,
        "num_events": run.loop.num_events, "end_time_s": run.end_time,
    }  # fmt: skip


def result_json(
    run: SimRun,
    workload: dict[str, Any] | None = None,
    is_token_times: bool = False,
    is_records: bool = True,
) -> dict[str, Any]:
    """Everything about a run: configuration, targets, summary, counters, records."""
    system, config = run.system, run.system.config
    records = records_of(run)
    predictor = system.predictor.describe()
    result = {
        "hardware": system.hardware.name, "model": system.model.name,
        "policy": config.scheduler.policy, "transfer_mode": config.cache.transfer_mode,
        "targets": targets_dict(system.targets), **summarize(records), **run_stats(run),
        "sim_wall_s": run.wall_s,
        "system": {
            "num_device_blocks": system.num_device_blocks, "num_host_blocks": system.num_host_blocks,
            "max_model_len": system.max_model_len,
            "kv_bytes_per_block": system.model.kv_bytes_per_block(config.cache.block_size),
            "num_params": system.model.num_params, "num_active_params": system.model.num_active_params,
        },
        "config": config.to_flat(), "workload": workload or {},
        "hardware_profile": asdict(system.hardware), "predictor": predictor,
        "step_noise": system.noise.to_dict(),
    }  # fmt: skip
    if run.engine.timeline:
        result["timeline"] = [asdict(s) for s in run.engine.timeline]
    by_class = {c: [r for r in records if r.targets.slo_class == c] for c in system.slo.class_names}
    if any(by_class.values()):  # requests put in classes (--slo-classes): each one's summary
        result["classes"] = {c: {"targets": targets_dict(rs[0].targets), **summarize(rs)}
                             for c, rs in by_class.items() if rs}  # fmt: skip
    if is_records:
        result["records"] = [request_dict(r, is_token_times) for r in records]
    return result
