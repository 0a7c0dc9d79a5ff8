"""fp64 gpt-oss forward pass written from the formulas in docs/model.md, plain torch ops.

It shares no code with transformers or vLLM: weights are read straight from the safetensors
files (MXFP4 expert blocks are dequantized here too), and every formula is spelled out below.
`Math` holds the choices the formulas make; a mutant flips one of them into a failure mode
seen in the wild (rounded YaRN range, window off by one, sinks dropped ...), so the checks can
prove they would catch it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from conformance.engines.base import Completion, StepLogprobs


@dataclass(frozen=True)
class Math:
    rope_style: str = "neox"  # rotate-half; "interleaved" rotates adjacent pairs (wrong for gpt-oss)
    yarn_rounded: bool = False  # floor/ceil the YaRN correction range (vllm#27722)
    window_offset: int = 0  # +-1: the sliding window sees one key too many or too few
    sink_count: int = 1  # 0: sinks ignored; 2: counted twice (split-KV decode bug)
    swiglu_clamp: bool = True
    swiglu_plus_one: bool = True
    gate_up_interleaved: bool = True  # False: gate = first half, up = second half
    renormalise_topk: bool = True  # False: softmax over all experts, then take the top-k weights
    router_bias: bool = True
    expert_bias: bool = True
    # Not a fault: the noise twin of a low-precision engine. Its weights, each block's input and output, the residual
    # stream and, inside the blocks, q, k and v (RoPE applied), the attention output before o_proj and the router
    # logits are rounded to this dtype, as a healthy engine of that dtype holds them (greedy parity at depth: the
    # noise a healthy stack accumulates over the layers, docs/verdicts.md "Greedy parity at depth"). On a checkpoint
    # stored in bf16 (the real gpt-oss) rounding its weights to bf16 changes nothing; on the tiny model's fp32 weights
    # it is most of the engine's noise.
    activations: str | None = None


MUTATIONS: dict[str, Math] = {
    "yarn_rounded": Math(yarn_rounded=True),
    "rope_interleaved": Math(rope_style="interleaved"),
    "window_127": Math(window_offset=-1),
    "window_129": Math(window_offset=+1),
    "sinks_dropped": Math(sink_count=0),
    "sinks_twice": Math(sink_count=2),
    "swiglu_no_clamp": Math(swiglu_clamp=False),
    "swiglu_no_plus_one": Math(swiglu_plus_one=False),
    "gate_up_halves": Math(gate_up_interleaved=False),
    "routing_not_renormalised": Math(renormalise_topk=False),
    "router_bias_dropped": Math(router_bias=False),
    "expert_bias_dropped": Math(expert_bias=False),
}

FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


# Each byte's two E2M1 values (low nibble first): one lookup per byte, not one per nibble and a stack.
FP4_PAIRS = torch.tensor([[FP4_VALUES[b & 0x0F], FP4_VALUES[b >> 4]] for b in range(256)], dtype=torch.float64)


@functools.cache
def _fp4_pairs_on(device: torch.device) -> torch.Tensor:
    """FP4_PAIRS on `device`, copied there once. Copied at every call, each of a device reference's thousands of
    dequantizations (two an expert, every layer, every pass) waited for the device's queued work: a copy from
    pageable memory synchronises its stream. A 16-layer P0 on an H100 spent 52.8 of the device reference's 74.8 s
    dequantizing so."""
    return FP4_PAIRS.to(device)


def _pairs_by_take(blocks: torch.Tensor) -> torch.Tensor:
    pair = torch.arange(2, device=blocks.device)
    return torch.take(_fp4_pairs_on(blocks.device), blocks.long().unsqueeze(-1) * 2 + pair)


def _pairs_by_index_select(blocks: torch.Tensor) -> torch.Tensor:
    return _fp4_pairs_on(blocks.device).index_select(0, blocks.flatten().int()).view(*blocks.shape, 2)


# Each byte of the blocks as its two E2M1 values [..., 2], fp64, the fastest way to the same bits on each device kind
# (a [5760, 90, 16] gate_up matrix): on an H200 indexing the [256, 2] table ran PyTorch's gather
# kernel at 5.1 ms and torch.take on the flat table 0.28 ms; on the CPU take is the slowest (135 ms on two cores) and
# index_select the fastest (56 ms, against 116 ms for indexing). Other devices take.
FP4_LOOKUP = {"cpu": _pairs_by_index_select}


def dequant_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """OCP MX: 32 E2M1 values per block (low nibble = even element) times 2^(scale-127). Exact in fp64. The CPU's
    spot checks of the device reference spend most of their time here at gpt-oss-120b's dimensions (the routed
    experts of their rows); one lookup per byte (`FP4_LOOKUP`), not one per nibble, to the same bits."""
    vals = FP4_LOOKUP.get(blocks.device.type, _pairs_by_take)(blocks).flatten(-2)  # [..., nblocks, 32]
    vals.mul_(torch.pow(2.0, scales.to(torch.float64) - 127.0).unsqueeze(-1))
    return vals.flatten(-2)


def yarn_inv_freq(cfg: dict, head_dim: int, rounded: bool = False) -> tuple[torch.Tensor, float]:
    """inv_freq and the concentration (attention scaling) of gpt-oss YaRN RoPE."""
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    base = float(cfg.get("rope_theta") or rs.get("rope_theta"))
    factor, orig = float(rs["factor"]), float(rs["original_max_position_embeddings"])
    beta_fast, beta_slow = float(rs["beta_fast"]), float(rs["beta_slow"])
    d_half = head_dim / 2
    freq = base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    concentration = 0.1 * math.log(factor) + 1.0
    low = d_half * math.log(orig / (beta_fast * 2 * math.pi)) / math.log(base)
    high = d_half * math.log(orig / (beta_slow * 2 * math.pi)) / math.log(base)
    if rounded:
        low, high = math.floor(low), math.ceil(high)
    ramp = ((torch.arange(d_half, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    inv_freq = ramp / (factor * freq) + (1 - ramp) / freq
    return inv_freq, concentration


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> torch.Tensor:
    """x [T, heads, D]; cos/sin [T, D/2]."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    if style == "neox":
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


# Of the host memory available when a CPU store opens, the share its fp64 tensors may hold (the engine under test and
# the run need the rest). gpt-oss-120b's experts are about 25 GB a layer in fp64 and its embeddings and lm_head 9.3 GB:
# a host without that much keeps the tensors it must and dequantizes each expert again where it is used.
HOST_MEMORY_SHARE = 0.5
# On a GPU the store shares the device with the engine under test (gpu_memory_utilization 0.9 on the 120b profiles
# leaves about 14 GB of an H200): an expert is kept only while this much of the device stays free after it.
DEVICE_HEADROOM = 4 * 2**30
HEAD_CHUNK = 16384  # lm_head rows widened to fp64 at a time on a GPU (377 MB at hidden 2880)


def host_memory_available() -> int:
    """What the host can give without swapping (MemAvailable), in bytes; free pages where /proc/meminfo is not."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def top_experts(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The k experts of each row's largest router logits; of equal logits the lower expert index first, on every
    device. torch.topk leaves the order of ties to the device's kernel: the noise twin rounds its router logits to
    bf16, where a tie at the k-th place is common, and a CUDA and a CPU topk that broke one differently sent the
    device's and the CPU's fp64 rows to different experts (a DeviceMismatch at 16 layers on an H100)."""
    return torch.sort(logits, dim=-1, descending=True, stable=True).indices[..., :k]


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class WeightStore:
    """Tensors read from the safetensors shards on first use, as fp64. Experts are read one at a time
    (MXFP4 blocks dequantized on the fly), so a reference of a 120b checkpoint only ever holds the
    experts its tokens are routed to; `streaming` drops a layer's tensors once it has run. On another `device` the
    tensors are moved there as stored (MXFP4 blocks as bytes) and widened to fp64 there. On the CPU the store holds
    at most `budget` bytes (HOST_MEMORY_SHARE of what the host has available when it opens): an expert that would
    pass it is dequantized for its use and not kept, so the reference runs, slower, where the memory is short."""

    def __init__(self, model_dir: Path, streaming: bool = False, device: str = "cpu",
                 weights_dtype: str | None = None) -> None:
        from safetensors import safe_open

        self.streaming, self.device = streaming, torch.device(device)
        # the noise twin's: every tensor rounded to the dtype an engine of that dtype holds it in, then widened
        self.weights_dtype = getattr(torch, weights_dtype) if weights_dtype else None
        self.where: dict[str, Any] = {}
        for f in sorted(model_dir.glob("*.safetensors")):
            handle = safe_open(str(f), framework="pt")
            for k in handle.keys():
                self.where[k] = handle
        self.cache: dict[str, Any] = {}
        # bytes the cache may hold (None: no bound) and holds
        self.budget = int(host_memory_available() * HOST_MEMORY_SHARE) if self.device.type == "cpu" else None
        self.held = 0
        # what the device has free now (the engine's share counted), for a store on a GPU; None on the CPU
        self.device_free: Callable[[], int] | None = (
            (lambda: torch.cuda.mem_get_info(self.device)[0]) if self.device.type == "cuda" else None)
        self.experts_not_kept = 0  # expert dequantizations that did not fit the budget
        self.widened = 0  # MXFP4 matrices widened to fp64 (what "dequantize" below is the seconds of)
        # seconds spent reading the checkpoint's bytes onto the store's device, and widening MXFP4 experts there
        # (a device reference's "device weights read" and "device dequantize": an H100 once ran it at 5.5 s a layer
        # and its record could not say which part); on a GPU timed by events on the device's own timeline, so
        # that the timing adds no synchronisation (`settle` reads them once the work is done)
        # "expert slices read" is the part of "weights read" that routed experts' slices took (`_slice`): an H100 read
        # a layer's experts 2.2x faster through pinned buffers while P0's weights read did not fall, and could not say
        # which part of it the experts were
        self.spent = {"weights read": 0.0, "expert slices read": 0.0, "dequantize": 0.0}
        self._events: list[tuple[str, Any, Any]] = []
        # whether whole tables (embeddings, lm_head) are held in fp64: on the CPU, not beside an engine on a GPU
        self.keeps_tables = self.device.type == "cpu"
        # a GPU store's page-locked host buffers for expert slices, by (shape, dtype): the buffer and the event of
        # its last copy to the device
        self._staging: dict[tuple[tuple[int, ...], torch.dtype], tuple[torch.Tensor, Any]] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.where

    @contextmanager
    def timed(self, what: str) -> Iterator[None]:
        """Add the seconds the block takes to `spent[what]`: on the host's clock for a CPU store; on a GPU from the
        moment the device reaches the block's work (done with what was queued before it) to the end of that work,
        read by `settle`."""
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((what, start, end))
            return
        started = time.perf_counter()
        yield
        self.spent[what] += time.perf_counter() - started

    def settle(self) -> dict[str, float]:
        """`spent`, with the GPU's timed blocks so far read in (waiting for the last of them)."""
        for what, start, end in self._events:
            end.synchronize()
            self.spent[what] += start.elapsed_time(end) / 1000.0
        self._events.clear()
        return self.spent

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.cache:
            if name not in self.where:
                raise KeyError(f"the checkpoint has no tensor {name}")
            with self.timed("weights read"):
                self.cache[name] = self._wide(self.where[name].get_tensor(name).to(self.device))
            self.held += _nbytes(self.cache[name])
        return self.cache[name]

    def rows(self, name: str, ids: list[int]) -> torch.Tensor:
        """Rows `ids` of a 2-D tensor, fp64 on the store's device. A GPU store gathers them on the host and keeps
        no copy of the whole table: gpt-oss-120b's embeddings are 4.6 GB in fp64, beside an engine that holds 90%
        of the device."""
        if self.keeps_tables or name in self.cache:
            return self[name][torch.tensor(ids, device=self.device)]
        table, distinct = self.where[name].get_slice(name), sorted(set(ids))
        with self.timed("weights read"):
            rows = self._wide(torch.cat([table[i:i + 1] for i in distinct]).to(self.device))  # read row by row
        where = {token: n for n, token in enumerate(distinct)}
        return rows[torch.tensor([where[i] for i in ids], device=self.device)]

    def times_transposed(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x @ W.T for a 2-D tensor W [out, in] of the checkpoint, fp64. A GPU store widens W to fp64 a chunk of
        HEAD_CHUNK rows at a time (gpt-oss-120b's lm_head is 4.6 GB in fp64), keeping W as stored (bf16, 1.2 GB) on
        the device only while DEVICE_HEADROOM stays free beside it, else reading each chunk from the file."""
        if self.keeps_tables or name in self.cache:
            return x @ self[name].T
        table = self.where[name].get_slice(name)
        rows = int(table.get_shape()[0])
        stored = self.cache.get(name + "#stored")
        if stored is None:
            size = _nbytes(table[:1]) * rows
            if self.device_free is not None and self.device_free() - size >= DEVICE_HEADROOM:
                with self.timed("weights read"):
                    stored = self.cache[name + "#stored"] = self.where[name].get_tensor(name).to(self.device)
                self.held += size
        out = torch.empty(x.shape[0], rows, dtype=torch.float64, device=x.device)
        for start in range(0, rows, HEAD_CHUNK):
            end = min(rows, start + HEAD_CHUNK)
            if stored is not None:
                chunk = stored[start:end]
            else:
                with self.timed("weights read"):
                    chunk = table[start:end].to(self.device)
            out[:, start:end] = x @ self._wide(chunk).T
        return out

    def _slice(self, name: str, e: int) -> torch.Tensor:
        """Expert e's slice of tensor `name`, as stored, on the store's device. A GPU's comes through a page-locked
        host buffer (`_pinned`): one H100 read a layer of 120b's experts at 7.6 GB/s as pageable slices and at
        26.7 GB/s through pinned buffers (`python -m conformance.reference.reads`)."""
        with self.timed("weights read"), self.timed("expert slices read"):
            part = self.where[name].get_slice(name)[e]
            return self._pinned(part) if self.device.type == "cuda" else part.to(self.device)

    def _pinned(self, part: torch.Tensor) -> torch.Tensor:
        """`part` copied to the device through a pinned host buffer kept per shape and dtype (a few MB each, shared
        by every layer), without blocking; the buffer is refilled only once its last copy to the device is done."""
        key = (tuple(part.shape), part.dtype)
        if key not in self._staging:
            self._staging[key] = (torch.empty_like(part).pin_memory(), torch.cuda.Event())
        buffer, copied = self._staging[key]
        copied.synchronize()
        buffer.copy_(part)
        out = torch.empty_like(part, device=self.device).copy_(buffer, non_blocking=True)
        copied.record()
        return out

    def _wide(self, t: torch.Tensor) -> torch.Tensor:
        """t in fp64, as stored or (the noise twin) as an engine of `weights_dtype` holds it."""
        return (t if self.weights_dtype is None else t.to(self.weights_dtype)).to(torch.float64)

    def expert(self, prefix: str, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(W1 [2I, H], b1 [2I], W2 [H, I], b2 [H]) of expert e, whatever the on-disk layout."""
        key = f"{prefix}experts#{e}"
        if key in self.cache:
            return self.cache[key]
        mats = []
        for stem in ("gate_up_proj", "down_proj"):
            name = prefix + "experts." + stem
            if name + "_blocks" in self.where:  # MXFP4, stored [out, in/32, 16]
                blocks, scales = self._slice(name + "_blocks", e), self._slice(name + "_scales", e)
                with self.timed("dequantize"):
                    mats.append(self._wide(dequant_mxfp4(blocks, scales)))
                self.widened += 1
            else:  # plain HF layout [in, out]
                mats.append(self._wide(self._slice(name, e)).T)
        b1 = self._wide(self._slice(prefix + "experts.gate_up_proj_bias", e))
        b2 = self._wide(self._slice(prefix + "experts.down_proj_bias", e))
        got = (mats[0], b1, mats[1], b2)
        size = _nbytes(*got)
        if (self.budget is not None and self.held + size > self.budget) or (
                self.device_free is not None and self.device_free() - size < DEVICE_HEADROOM):
            self.experts_not_kept += 1
            return got
        self.cache[key] = got
        self.held += size
        return got

    def release(self) -> None:
        """Drop every tensor held and hand a GPU's cached blocks back to the device, so that an engine started
        after this reference's computation finds the device as free as before it."""
        self.cache.clear()
        self._staging.clear()
        self.held = 0
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def done_with(self, prefix: str) -> None:
        if self.streaming:
            for k in [k for k in self.cache if k.startswith(prefix)]:
                value = self.cache.pop(k)
                self.held -= _nbytes(*value) if isinstance(value, tuple) else _nbytes(value)


def scored(lp: torch.Tensor, prompt: list[int], continuation: list[int], top_k: int) -> Completion:
    """The Completion of a path teacher-forced through logprobs `lp` [T, vocab] of prompt + continuation[:-1]."""
    prompt_steps = [StepLogprobs.from_row(lp[t], top_k, chosen=prompt[t + 1]) for t in range(len(prompt) - 1)]
    steps = [StepLogprobs.from_row(lp[len(prompt) - 1 + t], top_k, chosen=continuation[t])
             for t in range(len(continuation))]
    return Completion(list(prompt), list(continuation), steps, prompt_steps)


class Reference:
    """fp64 gpt-oss on the CPU for a checkpoint directory (HF layout, plain or MXFP4 experts). With another `device`
    its layers run there (`layer`, `embed`, `head`; rope tables stay on the CPU): reference/device.py checks them."""

    def __init__(self, model_dir: Path | str, math_: Math | str | None = None, streaming: bool = False,
                 device: str = "cpu") -> None:
        self.model_dir = Path(model_dir)
        self.math = MUTATIONS[math_] if isinstance(math_, str) else (math_ or Math())
        self.cfg = json.loads((self.model_dir / "config.json").read_text())
        self.w = WeightStore(self.model_dir, streaming, device, self.math.activations)
        c = self.cfg
        self.head_dim = int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
        self.inv_freq, self.concentration = yarn_inv_freq(c, self.head_dim, self.math.yarn_rounded)

    def rope_tables(self, positions: list[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [P, head_dim/2], concentration multiplied in."""
        pos = torch.as_tensor(positions, dtype=torch.float64)
        angles = pos[:, None] * self.inv_freq[None, :]
        return angles.cos() * self.concentration, angles.sin() * self.concentration

    @property
    def vocab_size(self) -> int:
        return int(self.cfg["vocab_size"])

    def _qkv(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer i's q, k, v [T, heads, head_dim], RoPE applied; k and v as the KV cache stores them."""
        c, m, w, p = self.cfg, self.math, self.w, f"model.layers.{i}.self_attn."
        n_h, n_kv, d = c["num_attention_heads"], c["num_key_value_heads"], self.head_dim
        t = x.shape[0]
        q = (x @ w[p + "q_proj.weight"].T + w[p + "q_proj.bias"]).view(t, n_h, d)
        k = (x @ w[p + "k_proj.weight"].T + w[p + "k_proj.bias"]).view(t, n_kv, d)
        v = (x @ w[p + "v_proj.weight"].T + w[p + "v_proj.bias"]).view(t, n_kv, d)
        r = self.rounded
        q, k = r(rope(q, cos, sin, m.rope_style)), r(rope(k, cos, sin, m.rope_style))
        return (q, *self._kv_stored(k, r(v)))

    def _kv_stored(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k and v as the cache holds them: exact here; a quantized-KV reference rounds them."""
        return k, v

    def _attention(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c, m, w, p = self.cfg, self.math, self.w, f"model.layers.{i}.self_attn."
        n_h, n_kv, d = c["num_attention_heads"], c["num_key_value_heads"], self.head_dim
        t = x.shape[0]
        q, k, v = self._qkv(i, x, cos, sin)
        rep = n_h // n_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
        qi = torch.arange(t, device=x.device)[:, None]
        kj = torch.arange(t, device=x.device)[None, :]
        visible = kj <= qi
        layer_types = c.get("layer_types") or ["sliding_attention" if j % 2 == 0 else "full_attention"
                                               for j in range(c["num_hidden_layers"])]
        if layer_types[i] == "sliding_attention":
            window = int(c["sliding_window"]) + m.window_offset
            visible &= (qi - kj) < window  # window 128: keys i-127 .. i
        scores = scores.masked_fill(~visible, float("-inf"))
        sink = w[p + "sinks"].view(n_h, 1, 1).expand(n_h, t, 1)
        if m.sink_count == 0:
            probs = torch.softmax(scores, dim=-1)
        else:
            # the sink joins the softmax normaliser once (or, mutated, twice) and carries no value
            sinks = [sink] * m.sink_count
            probs = torch.softmax(torch.cat([scores, *sinks], dim=-1), dim=-1)[..., :t]
        attn = self.rounded(torch.einsum("hqk,khd->qhd", probs, v).reshape(t, n_h * d))
        return attn @ w[p + "o_proj.weight"].T + w[p + "o_proj.bias"]

    def attention(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The attention block of layer i (qkv with biases, RoPE, window, sinks, o_proj) on normalised
        hidden states x [T, H], causal over the T positions 0..T-1."""
        return self._attention(i, x.to(torch.float64), cos, sin)

    def layer_type(self, i: int) -> str:
        types = self.cfg.get("layer_types") or ["sliding_attention" if j % 2 == 0 else "full_attention"
                                                for j in range(int(self.cfg["num_hidden_layers"]))]
        return "sliding" if types[i] == "sliding_attention" else "full"

    def router_logits(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Layer i's router logits [T, experts] on normalised hidden states x, its bias included, fp64."""
        p = f"model.layers.{i}.mlp."
        logits = x.to(torch.float64) @ self.w[p + "router.weight"].T
        return self.rounded(logits + self.w[p + "router.bias"] if self.math.router_bias else logits)

    def moe(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """The MoE block of layer i on normalised hidden states x [T, H]; only routed experts run."""
        x = x.to(torch.float64)
        return self.moe_routed(i, x, top_experts(self.router_logits(i, x), int(self.cfg["num_experts_per_tok"])))

    def moe_routed(self, i: int, x: torch.Tensor, top_idx: torch.Tensor) -> torch.Tensor:
        """The MoE block of layer i with each row of x [T, H] sent to the experts top_idx [T, k], weighted by the
        router's softmax over those k (over all experts where the math does not renormalise): `moe` with the
        router's own top-k, or another routing that a near-tie leaves open."""
        c, m, w, p = self.cfg, self.math, self.w, f"model.layers.{i}.mlp."
        limit = float(c.get("swiglu_limit", 7.0))
        x = x.to(torch.float64)
        logits = self.router_logits(i, x)
        top_idx = top_idx.to(logits.device)
        weights = (torch.softmax(logits.gather(-1, top_idx), dim=-1) if m.renormalise_topk
                   else torch.softmax(logits, dim=-1).gather(-1, top_idx))
        out = torch.zeros_like(x)
        for e in top_idx.unique().tolist():
            rows, slot = (top_idx == e).nonzero(as_tuple=True)
            w1, b1, w2, b2 = w.expert(p, e)
            h = x[rows] @ w1.T + (b1 if m.expert_bias else 0.0)
            g, u = (h[..., 0::2], h[..., 1::2]) if m.gate_up_interleaved else h.chunk(2, dim=-1)
            if m.swiglu_clamp:
                g, u = g.clamp(max=limit), u.clamp(-limit, limit)
            act = g * torch.sigmoid(1.702 * g) * (u + 1 if m.swiglu_plus_one else u)
            y = act @ w2.T + (b2 if m.expert_bias else 0.0)
            out.index_add_(0, rows, weights[rows, slot, None] * y)
        return out

    @property
    def eps(self) -> float:
        return float(self.cfg.get("rms_norm_eps", 1e-5))

    def embed(self, ids: list[int]) -> torch.Tensor:
        """The input hidden states [T, H] of token ids."""
        return self.w.rows("model.embed_tokens.weight", ids)

    def rounded(self, x: torch.Tensor) -> torch.Tensor:
        """x as the noise twin holds it (Math.activations: rounded to that dtype, kept in fp64); x itself otherwise."""
        dtype = self.math.activations
        return x if dtype is None else x.to(getattr(torch, dtype)).to(torch.float64)

    def layer(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Decoder layer i on the residual stream x [T, H]: attention, then MoE, each with its norm and residual."""
        return self.layer_many(i, [x], [(cos, sin)])[0]

    def layer_many(self, i: int, xs: list[torch.Tensor], tables: list[tuple[torch.Tensor, torch.Tensor]],
                   observe: Callable[[str, torch.Tensor, torch.Tensor], None] | None = None) -> list[torch.Tensor]:
        """`layer` over several sequences at once: attention per sequence, the MoE (per token) over all their
        tokens together, so each routed expert of the layer is read once for all of them. `observe`, if given, sees
        each block's normalised input and output as the per-layer check's probe does: ("attn", x, y) per sequence,
        then ("moe", x, y) over all their tokens."""
        w, p, r = self.w, f"model.layers.{i}.", self.rounded
        hs = []
        for x, (cos, sin) in zip(xs, tables):
            x_in = r(rms_norm(x, w[p + "input_layernorm.weight"], self.eps))
            y = r(self._attention(i, x_in, cos, sin))
            if observe is not None:
                observe("attn", x_in, y)
            hs.append(r(x + y))
        h = torch.cat(hs)
        x_in = r(rms_norm(h, w[p + "post_attention_layernorm.weight"], self.eps))
        y = r(self.moe(i, x_in))
        if observe is not None:
            observe("moe", x_in, y)
        return list(r(h + y).split([len(x) for x in hs]))

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """log-softmax of the next-token logits of the final residual stream x [T, H]."""
        normed = self.rounded(rms_norm(x, self.w["model.norm.weight"], self.eps))
        return torch.log_softmax(self.w.times_transposed(normed, "lm_head.weight"), dim=-1)

    @torch.no_grad()
    def logprobs(self, ids: list[int]) -> torch.Tensor:
        """log-softmax of the next-token logits at every position, [T, vocab], fp64."""
        cos, sin = self.rope_tables(torch.arange(len(ids)))
        x = self.embed(ids)
        for i in range(int(self.cfg["num_hidden_layers"])):
            x = self.layer(i, x, cos, sin)
            self.w.done_with(f"model.layers.{i}.")
        return self.head(x)

    def variant(self) -> dict[str, Any]:
        """What, besides the checkpoint and the call, decides this reference's results (reference/cache.py)."""
        return {"class": type(self).__name__, "math": dataclasses.asdict(self.math)}

    def score(self, prompt: list[int], continuation: list[int], top_k: int) -> Completion:
        """Teacher-forced along a given path: the reference's top-k at every prompt position
        (prefill) and at every step of the continuation (decode). Read from the result cache where a run
        turned it on (conformance/reference/cache.py)."""
        from conformance.reference import cache

        return cache.completion(self.model_dir, self.variant(), ["score", list(prompt), list(continuation), top_k],
                                lambda: self._score(prompt, continuation, top_k))

    def score_all(self, completions: list[Completion], top_k: int) -> list[Completion]:
        """`score` of each completion's path (its prompt and tokens), those the cache lacks computed together
        (`_score_many`: a device reference runs them layer by layer at once)."""
        from conformance.reference import cache

        calls = [["score", list(c.prompt_ids), list(c.token_ids), top_k] for c in completions]
        return cache.completions(self.model_dir, self.variant(), calls,
                                 lambda missing: self._score_many([(c[1], c[2], c[3]) for c in missing]))

    def _score_many(self, paths: list[tuple[list[int], list[int], int]]) -> list[Completion]:
        return [self._score(*path) for path in paths]

    def _score(self, prompt: list[int], continuation: list[int], top_k: int) -> Completion:
        return scored(self.logprobs(prompt + continuation[:-1] if continuation else prompt), prompt, continuation,
                      top_k)

    def generate_greedy(self, prompts: list[list[int]], max_tokens: int, top_k: int) -> list[Completion]:
        out = []
        for prompt in prompts:
            ids: list[int] = []
            steps = []
            for _ in range(max_tokens):
                row = self.logprobs(prompt + ids)[-1]
                token = int(row.argmax())
                steps.append(StepLogprobs.from_row(row, top_k, chosen=token))
                ids.append(token)
            out.append(Completion(prompt_ids=list(prompt), token_ids=ids, steps=steps))
        return out


