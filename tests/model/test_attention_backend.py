"""The attention-backend seam: the choice (declined backends are logged, never a crash) and
every backend's greedy tokens equal to the reference's on tiny models of the attention
variants (GQA, sliding window, soft-capping), with chunked prefill and decode packed in
each step. Triton runs through its CPU interpreter here."""

from __future__ import annotations

import logging

import pytest
import torch

from superinfer.model import triton_attention  # decorated under tests/conftest.py's interpreter
from superinfer.model.attention_backend import (
    BACKENDS,
    CpuBackend,
    ReferenceBackend,
    TritonBackend,
    select_backend,
)
from superinfer.model.cpu_attention import decode_kernel
from superinfer.model.loader import load_model
from tests.model.paged import PagedRun
from tests.model.test_architectures import _chunked_greedy, _saved

CPU = torch.device("cpu")


def test_auto_on_a_cpu_is_the_c_kernel_where_it_builds():
    backend = select_backend("auto", 16, CPU)
    expected = CpuBackend if decode_kernel() is not None else ReferenceBackend
    assert type(backend) is expected and backend.block_size == 16


def test_an_unknown_backend_is_an_error_naming_the_known_ones():
    with pytest.raises(ValueError, match="auto, cpu, triton, reference"):
        select_backend("flash", 16, CPU)


def test_a_backend_that_cannot_run_is_declined_with_its_reason(monkeypatch, caplog):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with caplog.at_level(logging.INFO, logger="superinfer.model.attention_backend"):
        backend = select_backend("triton", 16, CPU)
    assert backend.name in ("cpu", "reference")
    declined = [r.getMessage() for r in caplog.records if "declined" in r.getMessage()]
    assert declined and "triton" in declined[0]


def test_without_triton_installed_it_is_declined_not_a_crash(monkeypatch, caplog):
    monkeypatch.setattr(triton_attention, "triton", None)  # as when `import triton` failed
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "not installed" in TritonBackend.unavailable_reason(CPU)
    with caplog.at_level(logging.WARNING, logger="superinfer.model.attention_backend"):
        assert select_backend("triton", 16, CPU).name != "triton"
    assert "not installed" in caplog.text


def test_the_cpu_kernel_is_declined_off_a_cpu():
    assert "CPU" in CpuBackend.unavailable_reason(torch.device("meta"))


@pytest.fixture(scope="module", params=["llama", "mistral", "gemma2"])
def tiny_model(request, tmp_path_factory):
    """GQA 4:2 (llama), every layer windowed (mistral), soft-capped and mixed windows
    (gemma2); the sequences run past the windows (8)."""
    return load_model(str(_saved(request.param, tmp_path_factory)), torch.float32, "cpu").model


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_backend_gives_the_reference_greedy_tokens(tiny_model, name, monkeypatch):
    if name == "triton":
        pytest.importorskip("triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    if BACKENDS[name].unavailable_reason(CPU) is not None:
        pytest.skip(BACKENDS[name].unavailable_reason(CPU))
    expected = _chunked_greedy(PagedRun(tiny_model, num_blocks=64, block_size=4,
                                        backend="reference"))  # fmt: skip
    got = _chunked_greedy(PagedRun(tiny_model, num_blocks=64, block_size=4, backend=name))
    assert got == expected
