"""AWQ 4-bit linear layers as AutoAWQ saves them (version "gemm", zero point on).

Per quantized linear `<m>` of shape [out, in] the checkpoint holds
- `<m>.qweight` int32 [in, out / 8]: packed along the OUTPUT dimension (unlike GPTQ), in AWQ's interleaved
  order: slot k of a word holds output column AWQ_ORDER[k] = 0,2,4,6,1,3,5,7 of its group of eight;
- `<m>.qzeros` int32 [in / group_size, out / 8]: the zeros themselves (no "-1"), same packing and order;
- `<m>.scales` fp16 [in / group_size, out];
- `<m>.bias` fp16 [out] where the layer has one. There is no g_idx.
Dequantized: W[o, i] = scales[i // group_size, o] * (q[i, o] - zeros[i // group_size, o]).

Sources: AutoAWQ `awq/modules/linear/gemm.py::WQLinear_GEMM.from_linear` (order_map [0, 2, 4, 6, 1, 3, 5, 7])
and `awq/quantize/quantizer.py::pseudo_quantize_tensor`; vLLM `quantization/auto_awq.py`
(`_REVERSE_AWQ_PACK_ORDER`, `modules_to_not_convert` matched as substrings); transformers `AwqConfig`."""

from __future__ import annotations

import torch

from conformance.checkpoints.quant import int4

TENSORS = ("qweight", "qzeros", "scales")


def config(group_size: int, not_quantized: list[str]) -> dict:
    """`quantization_config` as AutoAWQ / transformers write it."""
    return {"quant_method": "awq", "bits": int4.BITS, "group_size": group_size, "zero_point": True,
            "version": "gemm", "modules_to_not_convert": list(not_quantized)}


def quantize(w: torch.Tensor, group_size: int) -> int4.GroupQuant:
    return int4.quantize_asym(w, group_size)


def pack(gq: int4.GroupQuant, order: tuple[int, ...] = int4.AWQ_ORDER) -> dict[str, torch.Tensor]:
    """The three on-disk tensors of one layer; `order` exists for negative controls only."""
    return {
        "qweight": int4.pack(gq.q.T, dim=1, order=order),
        "qzeros": int4.pack(gq.zeros, dim=1, order=order),
        "scales": gq.scales.to(torch.float16),
    }


def unpack(t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [out, in], zeros [groups, out]) from the on-disk tensors."""
    return int4.unpack(t["qweight"], dim=1, order=int4.AWQ_ORDER).T, int4.unpack(t["qzeros"], dim=1,
                                                                                  order=int4.AWQ_ORDER)


def dequantize(t: dict[str, torch.Tensor]) -> torch.Tensor:
    q, zeros = unpack(t)
    group_size = q.shape[1] // t["scales"].shape[0]
    g = torch.arange(q.shape[1]) // group_size
    return t["scales"].to(torch.float64)[g].T * (q.to(torch.float64) - zeros.to(torch.float64)[g].T)
