"""One function for the fp64 reference's WeightStore: the plain `<module>.weight` of a GPTQ, AWQ or FP8 linear,
dequantized by the suite's own dequantizers straight from the safetensors handles, so the reference can read a
user's quantized checkpoint (--model) without a dequantized copy. The format is told by the tensors present:
qweight + g_idx is GPTQ (v1 "-1" zeros, what AutoGPTQ and GPTQModel save), qweight alone is AWQ, a weight with a
weight_scale is compressed-tensors FP8. Anything else returns None and the store reads the tensor as it is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from conformance.checkpoints.quant.formats import FORMATS


def linear_weight(where: Mapping[str, Any], name: str) -> torch.Tensor | None:
    """`where` maps tensor names to open safetensors handles (WeightStore.where)."""
    if not name.endswith(".weight"):
        return None
    stem = name.removesuffix(".weight")
    if f"{stem}.qweight" in where:
        fmt = FORMATS["gptq" if f"{stem}.g_idx" in where else "awq"]
    elif f"{stem}.weight_scale" in where:
        fmt = FORMATS["fp8-channel"]  # the FP8 dequantizer handles per-channel and per-tensor scales alike
    else:
        return None
    tensors = {k: where[f"{stem}.{k}"].get_tensor(f"{stem}.{k}") for k in fmt.tensors}
    return fmt.read(tensors, None)
