"""The quantized formats the suite writes for the tiny gpt-oss, and which of its modules each quantizes.

Decision, from vLLM 0.32's GptOss loader (`models/gpt_oss.py`): quantized expert tensors are read only in the
MXFP4 layout (`_load_weights_mxfp4`), Quark's, and compressed-tensors' packed int4 per-expert layout.
GPTQ, AWQ and compressed-tensors FP8 checkpoints go through `_load_weights_other`, which copies the fused 3D
expert tensors verbatim. So these three formats quantize the attention projections (q/k/v/o, which vLLM
fuses into qkv_proj) and keep router, experts, embeddings and lm_head in the model dtype, marking the experts
unquantized the way each tool does: GPTQModel's `dynamic` "-:" rule, AWQ's `modules_to_not_convert`,
compressed-tensors' `ignore`. MXFP4 (conformance/checkpoints/quant/mxfp4.py) covers quantized experts.

`Misread` names a deliberately broken reader (a loader bug) for negative controls: it dequantizes the same
bytes the wrong way (nibbles reversed, AWQ's interleave ignored, FP8 scales inverted)."""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass

import torch

from conformance.checkpoints.quant import awq, fp8, gptq, int4

QUANTIZED_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")
NOT_QUANTIZED = ["mlp.experts", "mlp.router", "embed_tokens", "lm_head"]
GROUP_SIZE = 32  # several groups per row at the tiny model's widths (128, 256); Marlin supports 32
MISREADS = ("gptq_nibbles_reversed", "awq_plain_order", "fp8_scales_inverted")


@dataclass(frozen=True)
class QuantFormat:
    """One on-disk format: its config, how one linear layer is written, and its independent dequantizer."""

    name: str
    quant_method: str
    tensors: tuple[str, ...]  # what replaces `<module>.weight` on disk
    config: Callable[[], dict]
    write: Callable[[torch.Tensor, str | None], dict[str, torch.Tensor]]  # (w [out, in], writer bug) -> tensors
    read: Callable[[dict[str, torch.Tensor], str | None], torch.Tensor]  # (tensors, misread) -> W [out, in] fp64
    bias_dtype: torch.dtype = torch.bfloat16

    def step_bound(self, w: torch.Tensor, t: dict[str, torch.Tensor]) -> torch.Tensor:
        """The largest |original - dequantized| the format allows for each element of w [out, in]."""
        if self.quant_method == "compressed-tensors":
            s = t["weight_scale"].to(torch.float64)
            s = s.reshape(-1, 1) if s.numel() > 1 else s.reshape(())
            return fp8.e4m3_half_step(w.to(torch.float64) / s) * s * (1 + 2**-6)
        scales = t["scales"].to(torch.float64)
        g = torch.arange(w.shape[1]) // (w.shape[1] // scales.shape[0])
        s = scales[g].T
        return s * (0.5 + 16 * 2**-11)  # half a step, plus the fp16 rounding of the stored scale


def _gptq_write(w: torch.Tensor, bug: str | None) -> dict[str, torch.Tensor]:
    order = tuple(reversed(int4.GPTQ_ORDER)) if bug == "nibbles_reversed" else int4.GPTQ_ORDER
    return gptq.pack(gptq.quantize(w, GROUP_SIZE), "gptq", order)


def _gptq_read(t: dict[str, torch.Tensor], misread: str | None) -> torch.Tensor:
    if misread == "gptq_nibbles_reversed":  # a loader that reads slot 7 as element 0
        t = t | {"qweight": int4.pack(int4.unpack(t["qweight"], 0, tuple(reversed(int4.GPTQ_ORDER))), 0)}
    return gptq.dequantize(t, "gptq")


def _awq_write(w: torch.Tensor, bug: str | None) -> dict[str, torch.Tensor]:
    return awq.pack(awq.quantize(w, GROUP_SIZE), order=int4.GPTQ_ORDER if bug == "plain_order" else int4.AWQ_ORDER)


def _awq_read(t: dict[str, torch.Tensor], misread: str | None) -> torch.Tensor:
    if misread == "awq_plain_order":  # a loader that unpacks AWQ words in GPTQ's plain order
        q = int4.unpack(t["qweight"], dim=1, order=int4.GPTQ_ORDER).T
        z = int4.unpack(t["qzeros"], dim=1, order=int4.GPTQ_ORDER)
        t = t | {"qweight": int4.pack(q.T, 1, int4.AWQ_ORDER), "qzeros": int4.pack(z, 1, int4.AWQ_ORDER)}
    return awq.dequantize(t)


def _fp8_write(strategy: str) -> Callable[[torch.Tensor, str | None], dict[str, torch.Tensor]]:
    return lambda w, bug: fp8.quantize(w, strategy, invert_scale=bug == "scales_inverted")


def _fp8_read(t: dict[str, torch.Tensor], misread: str | None) -> torch.Tensor:
    if misread == "fp8_scales_inverted":
        t = t | {"weight_scale": 1 / t["weight_scale"].to(torch.float64)}
    return fp8.dequantize(t)


FP8_IGNORE = ["lm_head", "re:.*mlp\\.router$", "re:.*mlp\\.experts.*"]

FORMATS: dict[str, QuantFormat] = {
    "gptq": QuantFormat("gptq", "gptq", gptq.TENSORS, lambda: gptq.config(GROUP_SIZE, [".*\\.mlp\\.experts.*"]),
                        _gptq_write, _gptq_read, torch.float16),
    "awq": QuantFormat("awq", "awq", awq.TENSORS, lambda: awq.config(GROUP_SIZE, NOT_QUANTIZED),
                       _awq_write, _awq_read, torch.float16),
    "fp8-channel": QuantFormat("fp8-channel", "compressed-tensors", ("weight", "weight_scale"),
                               lambda: fp8.config("channel", FP8_IGNORE), _fp8_write("channel"), _fp8_read),
    "fp8-tensor": QuantFormat("fp8-tensor", "compressed-tensors", ("weight", "weight_scale"),
                              lambda: fp8.config("tensor", FP8_IGNORE), _fp8_write("tensor"), _fp8_read),
}
WRITER_BUGS = {"gptq": "nibbles_reversed", "awq": "plain_order", "fp8-channel": "scales_inverted",
               "fp8-tensor": "scales_inverted"}


def is_quantized_module(name: str) -> bool:
    """`model.layers.<i>.self_attn.<q|k|v|o>_proj` (the module, without `.weight`)."""
    parts = name.split(".")
    return len(parts) == 5 and parts[:2] == ["model", "layers"] and parts[3] == "self_attn" \
        and parts[4] in QUANTIZED_PROJ


def format_of(quantization_config: dict) -> QuantFormat:
    """The suite's format for a checkpoint's quantization_config (FP8 strategy read from its first group)."""
    method = str(quantization_config.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        groups = list((quantization_config.get("config_groups") or {}).values())
        strategy = (groups[0].get("weights") or {}).get("strategy") if groups else None
        return FORMATS["fp8-tensor" if strategy == "tensor" else "fp8-channel"]
    for f in FORMATS.values():
        if f.quant_method == method:
            return f
    raise KeyError(method)


def quantized_stems(names: Container[str] | list[str], fmt: QuantFormat) -> list[str]:
    """Module names whose format tensors are all present (by the format's first, defining tensor)."""
    first = fmt.tensors[0] if fmt.quant_method != "compressed-tensors" else "weight_scale"
    return sorted(n.removesuffix("." + first) for n in names if n.endswith("." + first))
