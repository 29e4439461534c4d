"""The host-link probe the calibration uses times real copies on a transfer engine."""

from __future__ import annotations

import torch

from superinfer.engine.kv_cache import KVCacheTiers
from superinfer.engine.transfer import create_transfer_engine
from superinfer.engine.transfer.link_probe import measure_link


def test_measure_link_times_both_directions_and_leaves_no_copy_behind():
    tiers = KVCacheTiers.allocate(64, 64, 2, 16, 2, 32, torch.float32, "cpu")
    transfer = create_transfer_engine(tiers)
    try:
        tiers.device.normal_()
        link = measure_link(transfer, tiers, num_blocks=16, repeats=2)
        assert link["gbps_per_direction"] > 0 and link["copy_overhead_s"] >= 0
        assert link["bytes_per_block"] == tiers.bytes_per_block
        assert link["both_directions_over_one"] > 0
        assert torch.equal(tiers.host[:16], tiers.device[:16])  # the D2H copies really ran
        assert not transfer.poll_finished()
    finally:
        transfer.close()
