"""Scheduling policies, chosen by name (`create_policy("fcfs-swap")`)."""

from superinfer.core.policies import fcfs  # noqa: F401  (registers the policies)
from superinfer.core.policies.base import (
    SchedulingPolicy,
    available_policies,
    create_policy,
    register_policy,
)

__all__ = ["SchedulingPolicy", "available_policies", "create_policy", "register_policy"]
