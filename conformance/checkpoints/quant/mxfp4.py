"""MXFP4 as gpt-oss stores it (OCP Microscaling spec v1.0): blocks of 32 E2M1 values sharing one
UE8M0 scale; two values per byte, the even element in the low nibble; expert tensors stored
[experts, out_features, in_features / 32, 16] with scales [experts, out_features, in_features / 32].

The quantizer follows the spec's conversion: shared exponent = floor(log2(amax)) - 2 (2 is the
largest E2M1 exponent), elements scaled by 2^-exp, rounded to the nearest E2M1 value, saturating
at 6. Dequantization lives in the reference (conformance.reference.gpt_oss.dequant_mxfp4)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from conformance.checkpoints.models import WEIGHTS_FILE, TinySpec, _weights, hf_config

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
MIDPOINTS = (E2M1[1:] + E2M1[:-1]) / 2  # where rounding to the nearest E2M1 magnitude changes
BLOCK = 32


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., K] (K a multiple of 32; bf16, fp16 or fp32) -> (blocks uint8 [..., K/32, 16], scales uint8 [..., K/32]).

    Exact in float32: the exponent comes from frexp (floor(log2(amax)) with no rounding of a log) and scaling by a
    power of two is exact. A magnitude exactly between two E2M1 values goes to the even encoding."""
    if w.shape[-1] % BLOCK:
        raise ValueError(f"MXFP4 needs the last dimension to be a multiple of 32, got {w.shape[-1]}")
    v = w.to(torch.float32).reshape(*w.shape[:-1], w.shape[-1] // BLOCK, BLOCK)
    amax = v.abs().amax(-1, keepdim=True)
    floor_log2 = torch.frexp(amax).exponent - 1  # amax = m * 2^e, m in [0.5, 1)
    exp = torch.where(amax > 0, floor_log2 - 2, torch.full_like(floor_log2, -127)).clamp(-127, 127)
    scaled = torch.ldexp(v, -exp).clamp(-6.0, 6.0)
    magnitude = scaled.abs().contiguous()  # bucketize copies a strided input (a transposed expert) anyway
    idx = torch.bucketize(magnitude, MIDPOINTS)  # nearest magnitude; a tie goes to the lower one here
    odd_tie = (idx % 2 == 1) & (magnitude == MIDPOINTS[idx.clamp(max=len(MIDPOINTS) - 1)])
    idx = idx + odd_tie.to(idx.dtype)  # round-half-to-even, as the spec's conversion
    nibble = (idx | torch.where((scaled < 0) & (idx > 0), 8, 0)).to(torch.uint8)  # no -0: canonical bytes
    packed = nibble[..., 0::2] | (nibble[..., 1::2] << 4)
    return packed.contiguous(), (exp.squeeze(-1) + 127).to(torch.uint8).contiguous()


NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def write_mxfp4_checkpoint(spec: TinySpec, out_dir: Path) -> Path:
    """The tiny model in the real gpt-oss on-disk layout: experts in MXFP4, everything else as is."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    weights = {}
    for name, t in _weights(spec).items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            blocks, scales = quantize(t.transpose(1, 2))  # HF [E, in, out] -> on disk [E, out, in]
            weights[name + "_blocks"], weights[name + "_scales"] = blocks, scales
        else:
            weights[name] = t
    config = hf_config(spec) | {"quantization_config": {"quant_method": "mxfp4",
                                                        "modules_to_not_convert": NOT_CONVERTED}}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    save_file(weights, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    return out_dir
