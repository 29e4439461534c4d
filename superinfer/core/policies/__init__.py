"""Scheduling policies, chosen by name (`create_policy("fcfs-swap")`)."""

from superinfer.core.policies import deadline, fcfs, priority, rotasched
from superinfer.core.policies.base import (
    MemoryState,
    SchedulingPolicy,
    available_policies,
    create_policy,
    register_policy,
)

__all__ = ["MemoryState", "SchedulingPolicy", "available_policies", "create_policy", "register_policy"]
