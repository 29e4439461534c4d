"""Discrete-event simulator: the real `core` scheduler, policies and KV manager, driven in
virtual time by a predicted-time model runner and KV transfer engine. See
docs/simulator.md; `superinfer simulate` and `superinfer calibrate` are its commands."""

from superinfer.sim.config import SimConfig, WorkloadConfig
from superinfer.sim.simulation import SimRun, build_system, simulate

__all__ = ["SimConfig", "SimRun", "WorkloadConfig", "build_system", "simulate"]
