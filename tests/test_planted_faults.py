"""The planted vLLM faults edit an engine's tables where they live: on a GPU engine, on the GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conformance.engines import faults


def _rope_table(n: int = 64, half: int = 8) -> torch.Tensor:
    inv = 1.0 / (150000.0 ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([angles.cos() * 1.3, angles.sin() * 1.3], dim=-1).float()


@pytest.mark.parametrize("fault", [{"positions": torch.arange(64, dtype=torch.float64)}, {"round_inv_freq": True}])
def test_rope_faults_edit_a_table_on_another_device_than_the_cpu(fault):
    """First contact on the H200: both RoPE faults built positions on the CPU beside vLLM's cos/sin cache on the
    GPU, and every faulted engine died at its start ("Expected all tensors to be on the same device"). The meta
    device stands in for the GPU: the edit must stay on the table's device, in place."""
    rot = SimpleNamespace(cos_sin_cache=_rope_table().to("meta"))
    storage = rot.cos_sin_cache
    faults._rebuild_vllm_cache(rot, **fault)
    assert rot.cos_sin_cache is storage and storage.device.type == "meta"


def test_rope_rebuild_without_a_fault_reproduces_the_table_and_with_one_moves_it():
    table = _rope_table()
    rot = SimpleNamespace(cos_sin_cache=table.clone())
    faults._rebuild_vllm_cache(rot)
    assert torch.allclose(rot.cos_sin_cache, table, atol=1e-5)
    faults._rebuild_vllm_cache(rot, round_inv_freq=True)
    assert (rot.cos_sin_cache - table).abs().max() > 1e-3


def test_rope_faults_edit_an_inference_tensor():
    """First contact on the H200: in the per-layer probe's eager engine the cos/sin cache is an inference tensor,
    and the in-place edit died there ("Inplace update to inference tensor outside InferenceMode is not allowed"):
    the layer check failed on the fault's own error, not on the fault. The edit runs under inference mode."""
    with torch.inference_mode():
        table = _rope_table().clone()
    assert table.is_inference()
    rot = SimpleNamespace(cos_sin_cache=table)
    faults._rebuild_vllm_cache(rot, round_inv_freq=True)
    assert rot.cos_sin_cache is table and (table - _rope_table()).abs().max() > 1e-3
