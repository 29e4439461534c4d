"""Admission in the simulator: the server's own rules refuse what the estimate says cannot
start in time, admitted requests keep their targets far more often than under no
admission, and the estimate's correction learns from simulated first tokens."""

from __future__ import annotations

from dataclasses import replace

from superinfer.sim.results import result_json
from tests.sim.helpers import run_small, small_workload


def overload(num_requests: int = 120, rate: float = 30.0):
    workload = small_workload(num_requests=num_requests, rate=rate)
    classes = ("gold", "silver", "bronze", "bronze", "silver")
    return [replace(r, slo_class=classes[i % 5]) for i, r in enumerate(workload)]


def test_admission_refuses_under_overload_and_what_it_admits_keeps_its_targets():
    workload = overload()
    served = run_small(workload)
    admitted = run_small(workload, admission=True)
    without, with_ = result_json(served), result_json(admitted)
    assert without["num_rejected"] == 0
    assert 0 < with_["num_rejected"] < len(workload)
    assert with_["precision"] > without["precision"] + 0.2
    for record in with_["records"]:
        if record["outcome"] == "rejected":
            assert record["rejection_reason"] == "slo_infeasible"
    # class order: gold, ahead of every queue, is refused least
    refused = {name: c["num_rejected"] / c["num_requests"] for name, c in with_["classes"].items()}
    assert refused["gold"] < refused["bronze"]


def test_the_correction_learns_from_simulated_first_tokens():
    run = run_small(overload(), admission=True)
    admission = run.engine.admission
    assert admission is not None and admission.step_time_s > 0
    factors = admission.admission.correction.applied(["gold", "silver", "bronze"])
    assert factors and all(0.5 <= f <= 10 for f in factors.values())


def test_an_idle_system_admits_everything():
    run = run_small(small_workload(num_requests=10, rate=0.5), admission=True)
    assert not run.rejected and all(r.is_finished for r in run.requests)
