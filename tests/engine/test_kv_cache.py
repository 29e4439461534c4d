from __future__ import annotations

import pytest
import torch

from superinfer.engine.kv_cache import GIB, KVCacheTiers, bytes_per_block, num_blocks_for_bytes

SMOLLM2 = dict(num_layers=30, block_size=16, num_kv_heads=3, head_dim=64)
LLAMA3_8B = dict(num_layers=32, block_size=16, num_kv_heads=8, head_dim=128)


def test_bytes_per_block_of_known_models() -> None:
    assert bytes_per_block(**SMOLLM2, dtype=torch.bfloat16) == 30 * 2 * 16 * 3 * 64 * 2
    assert bytes_per_block(**LLAMA3_8B, dtype=torch.bfloat16) == 2 * 1024 * 1024  # 2 MiB
    assert bytes_per_block(**LLAMA3_8B, dtype=torch.float32) == 4 * 1024 * 1024


def test_num_blocks_for_bytes_rounds_down() -> None:
    assert num_blocks_for_bytes(GIB, **LLAMA3_8B, dtype=torch.bfloat16) == 512
    assert num_blocks_for_bytes(GIB - 1, **LLAMA3_8B, dtype=torch.bfloat16) == 511
    assert num_blocks_for_bytes(1.5 * GIB, **LLAMA3_8B, dtype=torch.bfloat16) == 768
    assert num_blocks_for_bytes(0, **LLAMA3_8B, dtype=torch.bfloat16) == 0
    with pytest.raises(ValueError):
        num_blocks_for_bytes(-1, **LLAMA3_8B, dtype=torch.bfloat16)


def test_allocate_shapes_zeros_and_no_pinning_on_cpu() -> None:
    kv = KVCacheTiers.allocate(6, 10, num_layers=2, block_size=4, num_kv_heads=3, head_dim=8)
    assert kv.device.shape == (6, 2, 2, 4, 3, 8)
    assert kv.host.shape == (10, 2, 2, 4, 3, 8)
    assert kv.device.dtype == kv.host.dtype == torch.bfloat16
    assert (kv.num_device_blocks, kv.num_host_blocks) == (6, 10)
    assert (kv.num_layers, kv.block_size) == (2, 4)
    assert kv.bytes_per_block == bytes_per_block(2, 4, 3, 8, torch.bfloat16)
    assert kv.device[0].is_contiguous() and kv.device[2:5].is_contiguous()
    assert not kv.device.any() and not kv.host.any()
    assert kv.host.device.type == "cpu" and not kv.host.is_pinned()


def test_tiers_must_mirror_each_other() -> None:
    device = torch.zeros(4, 2, 2, 4, 3, 8)
    with pytest.raises(ValueError, match="mirror"):
        KVCacheTiers(device=device, host=torch.zeros(4, 2, 2, 4, 3, 16))
    with pytest.raises(ValueError, match="mirror"):
        KVCacheTiers(device=device, host=torch.zeros(4, 2, 2, 4, 3, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="shape"):
        KVCacheTiers(device=torch.zeros(4, 2, 3, 4, 3, 8), host=torch.zeros(4, 2, 3, 4, 3, 8))
    with pytest.raises(ValueError, match="contiguous"):
        KVCacheTiers(device=device, host=torch.zeros(8, 2, 2, 4, 3, 8)[::2])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_allocate_on_cuda_pins_the_host_tier() -> None:
    kv = KVCacheTiers.allocate(4, 8, 2, 4, 3, 8, dtype=torch.float16, device="cuda")
    assert kv.device.is_cuda and kv.host.is_pinned()
    assert kv.host.numel() * kv.host.element_size() == 8 * kv.bytes_per_block
