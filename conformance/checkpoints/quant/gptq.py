"""GPTQ 4-bit linear layers as AutoGPTQ / GPTQModel save them (format "gptq", the v1 layout).

Per quantized linear `<m>` of shape [out, in] the checkpoint holds
- `<m>.qweight` int32 [in / 8, out]: packed along the input dimension, element k of a word in bits 4k..4k+3;
- `<m>.qzeros` int32 [in / group_size, out / 8]: packed along the output dimension, storing zero - 1
  (the "-1" convention of v1; GPTQModel's internal "gptq_v2" stores the zero itself). Symmetric 4-bit
  zeros are 8, so v1 words are 0x77777777 and v2 words 0x88888888;
- `<m>.scales` fp16 [in / group_size, out];
- `<m>.g_idx` int32 [in]: the group of each input column, i // group_size without act-order;
- `<m>.bias` fp16 [out] where the layer has one.
Dequantized: W[o, i] = scales[g_idx[i], o] * (q[i, o] - zero[g_idx[i], o]).

Sources: AutoGPTQ `nn_modules/qlinear/qlinear_cuda_old.py::QuantLinear.pack` and `quantization/quantizer.py`,
vLLM `quantization/auto_gptq.py` (create_weights: qweight [in/8, out], qzeros [groups, out/8],
scales [groups, out]; desc_act=True is refused), transformers `GPTQConfig` (`checkpoint_format`)."""

from __future__ import annotations

import torch

from conformance.checkpoints.quant import int4

TENSORS = ("qweight", "qzeros", "scales", "g_idx")


def config(group_size: int, not_quantized: list[str], checkpoint_format: str = "gptq") -> dict:
    """`quantization_config` as GPTQModel writes it; `dynamic` with "-:" rules is how GPTQModel marks
    modules left unquantized, and the rule vLLM reads to keep a fused MoE layer unquantized."""
    return {"quant_method": "gptq", "bits": int4.BITS, "group_size": group_size, "desc_act": False, "sym": True,
            "static_groups": False, "true_sequential": True, "damp_percent": 0.01, "lm_head": False,
            "checkpoint_format": checkpoint_format,
            "dynamic": {f"-:{pattern}": {} for pattern in not_quantized}}


def quantize(w: torch.Tensor, group_size: int) -> int4.GroupQuant:
    return int4.quantize_sym(w, group_size)


def pack(gq: int4.GroupQuant, checkpoint_format: str = "gptq",
         order: tuple[int, ...] = int4.GPTQ_ORDER) -> dict[str, torch.Tensor]:
    """The four on-disk tensors of one layer; `order` exists for negative controls only."""
    offset = 1 if checkpoint_format == "gptq" else 0
    k = gq.q.shape[1]
    return {
        "qweight": int4.pack(gq.q.T, dim=0, order=order),
        "qzeros": int4.pack(gq.zeros - offset, dim=1, order=order),
        "scales": gq.scales.to(torch.float16),
        "g_idx": (torch.arange(k) // gq.group_size).to(torch.int32),
    }


def unpack(t: dict[str, torch.Tensor], checkpoint_format: str = "gptq") -> tuple[torch.Tensor, torch.Tensor]:
    """(q [out, in], zeros [groups, out]) from the on-disk tensors."""
    offset = 1 if checkpoint_format == "gptq" else 0
    q = int4.unpack(t["qweight"], dim=0).T
    zeros = int4.unpack(t["qzeros"], dim=1) + offset
    return q, zeros


def dequantize(t: dict[str, torch.Tensor], checkpoint_format: str = "gptq") -> torch.Tensor:
    """W [out, in] in fp64, read through g_idx as the format defines it (any act-order permutation works)."""
    q, zeros = unpack(t, checkpoint_format)
    g = t["g_idx"].to(torch.int64)
    s = t["scales"].to(torch.float64)[g].T  # [out, in]
    z = zeros.to(torch.float64)[g].T
    return s * (q.to(torch.float64) - z)
