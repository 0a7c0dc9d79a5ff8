"""4-bit integers packed eight to an int32, as GPTQ and AWQ store them, and the round-to-nearest
group quantizers both tools apply before packing.

Packing: slot k of a word holds bits 4k..4k+3 (slot 0 is the least significant nibble). GPTQ puts
logical element k in slot k (AutoGPTQ `QuantLinear.pack`); AWQ's GEMM layout puts logical element
AWQ_ORDER[k] in slot k, i.e. slots hold elements 0,2,4,6,1,3,5,7 (AutoAWQ `WQLinear_GEMM.from_linear`,
vLLM `_REVERSE_AWQ_PACK_ORDER` undoes it). Words are int32: a nibble >= 8 in slot 7 makes them negative.

Quantizers (per group of `group_size` input columns of a weight [out, in]):
- symmetric (GPTQ `Quantizer.find_params`, sym=True, maxq=15): scale = 2*max|w|/15, zero = 8,
  q = clamp(round(w/scale) + 8, 0, 15);
- asymmetric (AWQ `pseudo_quantize_tensor`, zero_point=True): scale = (max-min)/15,
  zero = clamp(-round(min/scale), 0, 15), q = clamp(round(w/scale) + zero, 0, 15).
Scales are stored fp16, so the integers are computed with the fp16-rounded scale (as the packers do:
they divide by the half-precision scale), which keeps |w - scale*(q-zero)| within half a step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

BITS = 4
PER_WORD = 32 // BITS
MAXQ = 2**BITS - 1
GPTQ_ORDER = (0, 1, 2, 3, 4, 5, 6, 7)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def pack(values: torch.Tensor, dim: int, order: tuple[int, ...] = GPTQ_ORDER) -> torch.Tensor:
    """Integers in [0, 15] -> int32 words, eight consecutive elements of `dim` per word."""
    v = values.to(torch.int64)
    if v.min() < 0 or v.max() > MAXQ:
        raise ValueError(f"4-bit values must lie in [0, {MAXQ}], got [{int(v.min())}, {int(v.max())}]")
    v = v.movedim(dim, -1)
    if v.shape[-1] % PER_WORD:
        raise ValueError(f"the packed dimension ({v.shape[-1]}) must be a multiple of {PER_WORD}")
    groups = v.reshape(*v.shape[:-1], v.shape[-1] // PER_WORD, PER_WORD)[..., list(order)]
    shifts = torch.arange(0, 32, BITS, dtype=torch.int64)
    words = (groups << shifts).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words)  # two's complement into int32
    return words.to(torch.int32).movedim(-1, dim).contiguous()


def unpack(words: torch.Tensor, dim: int, order: tuple[int, ...] = GPTQ_ORDER) -> torch.Tensor:
    """int32 words -> int64 values in [0, 15]; the inverse of `pack` for the same order."""
    w = words.to(torch.int64).movedim(dim, -1) & 0xFFFFFFFF
    shifts = torch.arange(0, 32, BITS, dtype=torch.int64)
    slots = (w[..., None] >> shifts) & MAXQ  # [..., words, slot]
    logical = torch.empty_like(slots)
    logical[..., list(order)] = slots
    return logical.reshape(*w.shape[:-1], w.shape[-1] * PER_WORD).movedim(-1, dim)


@dataclass(frozen=True)
class GroupQuant:
    """A weight [out, in] quantized in groups along `in`: q [out, in] in [0, 15], scales and zeros
    [in / group_size, out] (the on-disk orientation of both tools), scales already fp16-rounded."""

    q: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group_size: int

    def dequantized(self) -> torch.Tensor:
        g = torch.arange(self.q.shape[1]) // self.group_size
        s = self.scales.to(torch.float64)[g].T
        z = self.zeros.to(torch.float64)[g].T
        return s * (self.q.to(torch.float64) - z)


def _groups(w: torch.Tensor, group_size: int) -> torch.Tensor:
    out, k = w.shape
    if k % group_size:
        raise ValueError(f"in_features {k} is not a multiple of group_size {group_size}")
    return w.to(torch.float64).reshape(out, k // group_size, group_size)


def _finish(v: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int) -> GroupQuant:
    scale16 = scale.to(torch.float16).to(torch.float64)  # stored fp16: quantize with what is stored
    q = (torch.round(v / scale16) + zero).clamp(0, MAXQ)
    out = v.shape[0]
    return GroupQuant(q.reshape(out, -1).to(torch.int64), scale16.squeeze(-1).T.to(torch.float16).contiguous(),
                      zero.expand_as(scale16).squeeze(-1).T.to(torch.int64).contiguous(), group_size)


def quantize_sym(w: torch.Tensor, group_size: int) -> GroupQuant:
    """GPTQ's symmetric round-to-nearest (what GPTQ reduces to without the Hessian update)."""
    v = _groups(w, group_size)
    xmax = v.abs().amax(-1, keepdim=True)
    xmax = torch.where(xmax == 0, torch.ones_like(xmax), xmax)
    return _finish(v, 2 * xmax / MAXQ, torch.full_like(xmax, (MAXQ + 1) / 2), group_size)


def quantize_asym(w: torch.Tensor, group_size: int) -> GroupQuant:
    """AWQ's zero-point round-to-nearest (its scale search only rescales w before this step)."""
    v = _groups(w, group_size)
    hi, lo = v.amax(-1, keepdim=True), v.amin(-1, keepdim=True)
    scale = ((hi - lo).clamp(min=1e-5) / MAXQ).to(torch.float16).to(torch.float64)
    zero = (-torch.round(lo / scale)).clamp(0, MAXQ)
    return _finish(v, scale, zero, group_size)
