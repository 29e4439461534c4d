"""local.py without processes: which GPU each replica gets."""

from __future__ import annotations

from superinfer.cluster.local import replica_gpu


def test_each_cuda_replica_gets_one_gpu_in_turn() -> None:
    assert [replica_gpu(i, "cuda", None) for i in range(3)] == ["0", "1", "2"]
    assert [replica_gpu(i, "cuda:0", "4, 6") for i in range(3)] == ["4", "6", "4"]


def test_off_cuda_the_environment_is_left_alone() -> None:
    assert replica_gpu(0, "cpu", "0,1") is None
    assert replica_gpu(1, "auto", None) is None
