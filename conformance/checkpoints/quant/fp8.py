"""FP8 (E4M3FN) linear layers as llm-compressor saves them: compressed-tensors, "float-quantized" format.

Per quantized linear `<m>` of shape [out, in] the checkpoint holds
- `<m>.weight` F8_E4M3 [out, in]: round(w / scale) to the nearest E4M3FN value (ties to even, torch's cast),
  saturated at +-448 (E4M3FN has no infinity);
- `<m>.weight_scale` in the model dtype: [out, 1] per output channel ("channel"), or [1] ("tensor");
  scale = max|w| / 448 over the channel or the tensor (compressed-tensors `calculate_qparams`:
  max / (bit_range / 2), bit_range = 448 - (-448)), rounded to the stored dtype before quantizing;
- `<m>.bias` unchanged. Activations are quantized by the engine at run time, per token and dynamically
  (scheme FP8_DYNAMIC: no input_scale tensor); the per-tensor variant keeps dynamic per-token activations
  too, since static activation scales need calibration data and vLLM-CPU lacks `static_scaled_fp8_quant`.
Dequantized: W = weight.float() * weight_scale (broadcast over the input dimension).

Sources: compressed-tensors `quantization/lifecycle/initialize.py` (scale shapes (out, 1) and (1,), scale dtype
= weight dtype), `quantization/utils/helpers.py::calculate_qparams`, preset FP8_DYNAMIC; vLLM
`compressed_tensors/schemes/compressed_tensors_w8a8_fp8.py` (per-tensor shards of a fused qkv are requantized
to their max scale at load time)."""

from __future__ import annotations

import torch

E4M3_MAX = 448.0
STRATEGIES = ("channel", "tensor")


def config(strategy: str, ignore: list[str]) -> dict:
    """`quantization_config` as llm-compressor writes it for FP8_DYNAMIC (strategy "channel") or its
    per-tensor-weight variant."""
    if strategy not in STRATEGIES:
        raise ValueError(f"FP8 weight strategy must be one of {STRATEGIES}, not {strategy!r}")
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None, "strategy": strategy,
               "block_structure": None, "dynamic": False, "actorder": None, "observer": "minmax",
               "observer_kwargs": {}}
    acts = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None, "strategy": "token",
            "block_structure": None, "dynamic": True, "actorder": None, "observer": None, "observer_kwargs": {}}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "kv_cache_scheme": None, "global_compression_ratio": None, "ignore": list(ignore),
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts,
                                          "output_activations": None, "format": None}}}


def quantize(w: torch.Tensor, strategy: str, scale_dtype: torch.dtype = torch.bfloat16,
             invert_scale: bool = False) -> dict[str, torch.Tensor]:
    """{"weight": fp8 [out, in], "weight_scale": [out, 1] or [1]}; `invert_scale` is for negative controls
    (a writer that stores 1/scale)."""
    v = w.to(torch.float64)
    amax = v.abs().amax(dim=1, keepdim=True) if strategy == "channel" else v.abs().amax().reshape(1)
    scale = (amax.clamp_min(1e-12) / E4M3_MAX).to(scale_dtype)
    stored = scale.to(torch.float64).reshape(-1, 1) if strategy == "channel" else scale.to(torch.float64)
    q = (v / stored).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return {"weight": q.contiguous(), "weight_scale": (1 / scale if invert_scale else scale).contiguous()}


def dequantize(t: dict[str, torch.Tensor]) -> torch.Tensor:
    w = t["weight"].to(torch.float64)
    s = t["weight_scale"].to(torch.float64)
    return w * (s.reshape(-1, 1) if s.numel() > 1 else s.reshape(()))


def e4m3_half_step(x: torch.Tensor) -> torch.Tensor:
    """Half the spacing of E4M3FN around |x| (3 mantissa bits; subnormal spacing 2^-9 below 2^-6)."""
    mag = x.abs().to(torch.float64).clamp_min(2.0**-6)
    return torch.pow(2.0, torch.floor(torch.log2(mag)) - 3) / 2
