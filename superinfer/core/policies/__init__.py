"""Scheduling policies, chosen by name (`create_policy("fcfs-swap")`)."""

# imported for their side effect: each module registers its policies by name
from superinfer.core.policies import deadline, fcfs, priority, rotasched  # noqa: F401
from superinfer.core.policies.base import (
    MemoryState,
    SchedulingPolicy,
    available_policies,
    create_policy,
    register_policy,
)

__all__ = ["MemoryState", "SchedulingPolicy", "available_policies", "create_policy", "register_policy"]
