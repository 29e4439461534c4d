"""The two KV cache tiers: one block-first tensor on the device, its mirror in host memory.

Each tier has shape (num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim), so one
block over all layers, K and V, is one contiguous chunk and `tier[start:start + n]` is n
consecutive blocks in one contiguous range: the transfer engines move a run with one copy.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from superinfer.model.config import ModelConfig

GIB = 1 << 30
NUM_KV = 2  # K and V


def freeable_window(config: ModelConfig) -> int | None:
    """The sliding window of every layer (the largest, if they differ), which lets the KV
    manager free blocks out of it; None when some layer attends to the whole context
    (Gemma 2/3's global layers) or none is windowed."""
    windows = [config.window(layer) for layer in range(config.num_layers)]
    if not windows or None in windows:
        return None
    return max(w for w in windows if w is not None)


def bytes_per_block(
    num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Bytes of one KV block over all layers, K and V."""
    return num_layers * NUM_KV * block_size * num_kv_heads * head_dim * dtype.itemsize


def num_blocks_for_bytes(
    num_bytes: int | float,
    num_layers: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
) -> int:
    """How many whole blocks fit in `num_bytes` (e.g. `--device-kv-gib * GIB`), rounded down."""
    if num_bytes < 0:
        raise ValueError(f"num_bytes must be >= 0, got {num_bytes}")
    return int(num_bytes // bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype))


@dataclass(frozen=True, eq=False)
class KVCacheTiers:
    """The device tier and the host tier of the KV cache.

    Both have shape (num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim) and the
    same dtype; only num_blocks differs. The host tier is a CPU tensor, pinned when the device
    tier is on CUDA. On a CPU-only machine both are CPU tensors (the device tier is a capped
    pool).
    """

    device: torch.Tensor
    host: torch.Tensor

    def __post_init__(self) -> None:
        _check_tiers(self.device, self.host)

    @classmethod
    def allocate(
        cls,
        num_device_blocks: int,
        num_host_blocks: int,
        num_layers: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
    ) -> KVCacheTiers:
        """Allocate both tiers, zero-filled.

        Zeros, not `empty`: filling commits every page now, so a pool too big for the machine
        fails at startup instead of at the first swap (and first-touch page faults do not
        land inside timed copies); and never-written slots hold 0, not NaN bit patterns that
        a masked attention would still multiply by 0. The cost is one fill at startup.
        """
        block_shape = (num_layers, NUM_KV, block_size, num_kv_heads, head_dim)
        device = torch.device(device)
        device_tier = torch.zeros((num_device_blocks, *block_shape), dtype=dtype, device=device)
        host_tier = torch.zeros((num_host_blocks, *block_shape), dtype=dtype)
        if device.type == "cuda":
            pin_in_place(host_tier)
        return cls(device=device_tier, host=host_tier)

    @property
    def num_device_blocks(self) -> int:
        return self.device.shape[0]

    @property
    def num_host_blocks(self) -> int:
        return self.host.shape[0]

    @property
    def num_layers(self) -> int:
        return self.device.shape[1]

    @property
    def block_size(self) -> int:
        return self.device.shape[3]

    @property
    def bytes_per_block(self) -> int:
        return self.device[0].numel() * self.device.element_size()


def _check_tiers(device: torch.Tensor, host: torch.Tensor) -> None:
    if device.dim() != 6 or device.shape[2] != NUM_KV:
        raise ValueError(
            "a KV tier must have shape (num_blocks, num_layers, 2, block_size, "
            f"num_kv_heads, head_dim), got {tuple(device.shape)}"
        )
    if host.shape[1:] != device.shape[1:] or host.dtype != device.dtype:
        raise ValueError(
            f"host tier {tuple(host.shape)} {host.dtype} does not mirror device tier "
            f"{tuple(device.shape)} {device.dtype} (all dims but num_blocks must match)"
        )
    if host.device.type != "cpu":
        raise ValueError(f"the host tier must be a CPU tensor, got {host.device}")
    if not (device.is_contiguous() and host.is_contiguous()):
        raise ValueError("KV tiers must be contiguous")


def pin_in_place(tensor: torch.Tensor) -> None:
    """Page-lock a CPU tensor's memory with cudaHostRegister (unregistered when it is freed).

    `torch.zeros(..., pin_memory=True)` goes through PyTorch's caching host allocator, which
    rounds each allocation up to a power of two: a 400 GiB host pool would pin 512 GiB.
    Registering the pages the tensor already owns pins exactly its size.
    """
    num_bytes = tensor.numel() * tensor.element_size()
    if num_bytes == 0:
        return
    ptr = tensor.data_ptr()
    error = int(torch.cuda.cudart().cudaHostRegister(ptr, num_bytes, 0))
    if error != 0:
        raise RuntimeError(f"cudaHostRegister of {num_bytes} bytes failed (CUDA error {error})")
    finalizer = weakref.finalize(tensor, _unpin, ptr)
    finalizer.atexit = False  # the process is exiting: the driver releases everything


def _unpin(ptr: int) -> None:
    torch.cuda.cudart().cudaHostUnregister(ptr)
