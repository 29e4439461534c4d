"""DuplexKV: transfer engines that move KV blocks between the device tier and the host tier.

`create_transfer_engine` picks the CUDA engine when the device tier is on CUDA, else the
CPU engine. Both implement `superinfer.core.kv.transfer.TransferEngine` plus
`KVTransferEngine`'s `record_compute`, `synchronize` and `stats`.
"""

from __future__ import annotations

from superinfer.engine.kv_cache import KVCacheTiers
from superinfer.engine.transfer.base import (
    MODES,
    DirectionStats,
    KVTransferEngine,
    TransferError,
    TransferStats,
    check_mode,
)
from superinfer.engine.transfer.cpu import CpuTransferEngine

__all__ = [
    "MODES",
    "CpuTransferEngine",
    "DirectionStats",
    "KVTransferEngine",
    "TransferError",
    "TransferStats",
    "create_transfer_engine",
]


def create_transfer_engine(kv: KVCacheTiers, mode: str = "duplex") -> KVTransferEngine:
    """The transfer engine for `kv`'s device: CUDA streams on CUDA, worker threads otherwise.

    `mode` is "duplex" (the default) or "naive" (the ablation); ValueError otherwise.
    """
    check_mode(mode)
    if kv.device.is_cuda:
        from superinfer.engine.transfer.cuda import CudaTransferEngine

        return CudaTransferEngine(kv, mode)
    return CpuTransferEngine(kv, mode)
