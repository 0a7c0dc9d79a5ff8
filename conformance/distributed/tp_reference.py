"""Tensor-parallel sharding of the fp64 reference, exactly as vLLM shards gpt-oss, so the shards'
recombination can be compared with the unsharded layer.

What vLLM 0.32 does (vllm/model_executor/models/gpt_oss.py and layers/linear.py):
- attention: QKVParallelLinear splits q by heads (heads/TP per rank) and k/v by kv heads; when
  TP >= kv heads each kv head is replicated on TP/kv ranks and rank r holds kv head r // (TP/kv).
  Sinks are split like q heads. o_proj is RowParallelLinear: each rank multiplies its heads' columns,
  the bias is added on rank 0 only, and the partial outputs are summed by an all-reduce.
- MoE: the router is replicated; every expert's intermediate dim is split. gate_up (w13) is
  column-parallel on rows 2*start .. 2*end of the *interleaved* on-disk layout (gate and up stay
  paired); down (w2) is row-parallel on columns start .. end; the w2 bias is loaded on rank 0 only
  and the experts' output is all-reduced.
- The uneven MXFP4 split (_load_weights_mxfp4): per-rank size = cdiv(I / 32, TP) * 32 blocks, rank r
  takes [r * per, min((r + 1) * per, I)). For 120b (I = 2880 = 90 blocks): TP 4 -> 736, 736, 736,
  672; TP 8 -> 7 x 384 and 192. The parameters are allocated at round_up(I / TP, alignment of the
  MoE backend) (fused_moe/oracle/mxfp4.py) and zero-filled, so the tail rank's missing rows are zeros.
  Unquantized checkpoints (_load_weights_other) use per = cdiv(I, TP) without block rounding.

`MUTATIONS` are sharding bugs (gate/up split as halves, o_proj not all-reduced, the uneven tail block
dropped, the o_proj bias added on every rank, replicated kv heads picked by rank % kv); the checks'
negative controls prove each is rejected.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

import torch

from conformance.distributed import RankContext
from conformance.reference.gpt_oss import Reference, WeightStore, dequant_mxfp4
from conformance.verdicts.compare import VerdictReport
from conformance.verdicts.verdict import FigureLimit

MX_BLOCK = 32
MUTATIONS = ("gate_up_halves", "o_proj_not_reduced", "tail_block_dropped", "o_proj_bias_every_rank",
             "kv_head_modulo")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return cdiv(a, b) * b


def intermediate_ranges(inter: int, tp: int, mxfp4: bool, mutation: str | None = None) -> list[tuple[int, int]]:
    """[start, end) of the intermediate units each rank loads, as vLLM's gpt-oss loader slices them."""
    if mxfp4:
        blocks = inter // MX_BLOCK
        per = (blocks // tp if mutation == "tail_block_dropped" else cdiv(blocks, tp)) * MX_BLOCK
    else:
        per = inter // tp if mutation == "tail_block_dropped" else cdiv(inter, tp)
    return [(min(r * per, inter), min((r + 1) * per, inter)) for r in range(tp)]


@dataclass(frozen=True)
class RankPlan:
    """What one rank holds."""

    tp: int
    rank: int
    heads: tuple[int, int]  # query heads [start, end)
    kv_heads: tuple[int, int]
    inter: tuple[int, int]  # intermediate units [start, end); may be empty on the tail ranks
    partition: int  # intermediate rows allocated per rank (>= the slice; the rest stays zero)
    mxfp4: bool
    mutation: str | None = None


def plan_for(cfg: dict, tp: int, rank: int, mxfp4: bool, alignment: int, mutation: str | None = None) -> RankPlan:
    n_h, n_kv, inter = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"]), int(cfg["intermediate_size"])
    if n_h % tp or (tp >= n_kv and tp % n_kv) or (tp < n_kv and n_kv % tp) or inter % tp:
        raise ValueError(f"TP {tp} does not divide {n_h} heads / {n_kv} kv heads / intermediate {inter} "
                         f"(vLLM asserts the same)")
    hpr = n_h // tp
    if tp >= n_kv:  # QKVParallelLinear: one kv head per rank, replicated tp / n_kv times
        kv = rank % n_kv if mutation == "kv_head_modulo" else rank // (tp // n_kv)
        kv_heads = (kv, kv + 1)
    else:
        kv_heads = (rank * (n_kv // tp), (rank + 1) * (n_kv // tp))
    ranges = intermediate_ranges(inter, tp, mxfp4, mutation)
    per = max(e - s for s, e in ranges)
    partition = max(round_up(inter // tp, alignment), per) if mxfp4 else per
    return RankPlan(tp, rank, (rank * hpr, (rank + 1) * hpr), kv_heads, ranges[rank], partition, mxfp4, mutation)


class ShardWeights:
    """The tensors one rank holds, read from the checkpoint slice by slice (a rank of a 120b layer
    never reads another rank's experts), as fp64; same interface as the reference's WeightStore."""

    def __init__(self, store: WeightStore, cfg: dict, plan: RankPlan) -> None:
        self.store, self.plan = store, plan
        self.inter, self.d = int(cfg["intermediate_size"]), int(cfg["head_dim"])
        self.cache: dict[str, Any] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.store

    def _read(self, name: str, index: tuple) -> torch.Tensor:
        return self.store.where[name].get_slice(name)[index].to(torch.float64)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self.cache:
            return self.cache[name]
        p, d = self.plan, self.d
        (h0, h1), (k0, k1) = p.heads, p.kv_heads
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            t = self._read(name, (slice(h0 * d, h1 * d),))
        elif name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
            t = self._read(name, (slice(k0 * d, k1 * d),))
        elif name.endswith("self_attn.sinks"):
            t = self._read(name, (slice(h0, h1),))
        elif name.endswith("o_proj.weight"):
            t = self._read(name, (slice(None), slice(h0 * d, h1 * d)))
        elif name.endswith("o_proj.bias"):
            t = self.store[name]
            if p.rank != 0 and p.mutation != "o_proj_bias_every_rank":
                t = torch.zeros_like(t)  # RowParallelLinear adds the bias on rank 0 only
        else:
            t = self.store[name]  # replicated: norms, router, embeddings
        self.cache[name] = t
        return t

    def _gate_up_rows(self) -> list[tuple[int, int]]:
        """Row ranges of the fused gate_up weight (interleaved: row 2j gate j, 2j+1 up j)."""
        s, e = self.plan.inter
        if self.plan.mutation == "gate_up_halves":  # as if stored [gate; up]: a Mixtral-style w13 split
            return [(s, e), (self.inter + s, self.inter + e)]
        return [(2 * s, 2 * e)]

    def _w13(self, stem: str, e: int, mxfp4: bool) -> torch.Tensor:
        parts = []
        for lo, hi in self._gate_up_rows():
            if mxfp4:
                blocks = self.store.where[stem + "_blocks"].get_slice(stem + "_blocks")[e, lo:hi]
                scales = self.store.where[stem + "_scales"].get_slice(stem + "_scales")[e, lo:hi]
                parts.append(dequant_mxfp4(blocks, scales))
            else:  # HF layout [E, H, 2I]
                parts.append(self._read(stem, (e, slice(None), slice(lo, hi))).T)
        if len(parts) == 1:
            return parts[0]
        return torch.stack(parts, dim=1).flatten(0, 1)  # re-interleave the two halves row by row

    def _w2(self, stem: str, e: int, mxfp4: bool) -> torch.Tensor:
        s, t = self.plan.inter
        if mxfp4:  # [E, H, I/32, 16]: the loader's byte slice [s/2, t/2) is blocks [s/32, t/32)
            blocks = self.store.where[stem + "_blocks"].get_slice(stem + "_blocks")[e, :, s // MX_BLOCK:t // MX_BLOCK]
            scales = self.store.where[stem + "_scales"].get_slice(stem + "_scales")[e, :, s // MX_BLOCK:t // MX_BLOCK]
            return dequant_mxfp4(blocks, scales)
        return self._read(stem, (e, slice(s, t))).T  # HF layout [E, I, H]

    def expert(self, prefix: str, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(W1 [2P, H], b1 [2P], W2 [H, P], b2 [H]) of this rank, zero-padded to the partition P."""
        key = f"{prefix}experts#{e}"
        if key in self.cache:
            return self.cache[key]
        part, stem = self.plan.partition, prefix + "experts."
        mxfp4 = stem + "gate_up_proj_blocks" in self.store
        w1 = self._w13(stem + "gate_up_proj", e, mxfp4)
        b1 = torch.cat([self._read(stem + "gate_up_proj_bias", (e, slice(lo, hi))) for lo, hi in self._gate_up_rows()])
        if self.plan.mutation == "gate_up_halves" and b1.numel():
            b1 = b1.view(2, -1).T.flatten()
        w2 = self._w2(stem + "down_proj", e, mxfp4)
        b2 = self._read(stem + "down_proj_bias", (e,))
        if self.plan.rank != 0:
            b2 = torch.zeros_like(b2)  # loaded on rank 0 only, zeroed elsewhere
        hidden = b2.shape[0]
        out = (torch.zeros(2 * part, hidden, dtype=torch.float64), torch.zeros(2 * part, dtype=torch.float64),
               torch.zeros(hidden, part, dtype=torch.float64), b2)
        out[0][: w1.shape[0]], out[1][: b1.shape[0]], out[2][:, : w2.shape[1]] = w1, b1, w2
        self.cache[key] = out
        return out

    def done_with(self, prefix: str) -> None:
        pass


def is_mxfp4(ref: Reference) -> bool:
    return any(name.endswith("_blocks") for name in ref.w.where)


def shard_reference(ref: Reference, plan: RankPlan) -> Reference:
    """Turn a fresh reference into one rank's: the reference's own attention and MoE code, with a
    config that says the local head counts and a weight store that hands out the shard."""
    full = dict(ref.cfg) | {"head_dim": ref.head_dim}
    ref.cfg = dict(ref.cfg) | {"num_attention_heads": plan.heads[1] - plan.heads[0],
                               "num_key_value_heads": plan.kv_heads[1] - plan.kv_heads[0]}
    ref.w = ShardWeights(ref.w, full, plan)  # type: ignore[assignment]
    return ref


def layer_inputs(ref: Reference, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden states [T, H] (seeded, so every rank and the parent build the same) and RoPE tables."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, int(ref.cfg["hidden_size"]), generator=gen, dtype=torch.float64)
    cos, sin = ref.rope_tables(list(range(tokens)))
    return x, cos, sin


def layer_outputs(ref: Reference, layers: list[int], tokens: int, seed: int) -> dict[str, torch.Tensor]:
    """Attention and MoE outputs of each layer on the same inputs (unsharded, or one rank's partials)."""
    x, cos, sin = layer_inputs(ref, tokens, seed)
    out = {}
    for i in layers:
        out[f"attention.{i}"] = ref._attention(i, x, cos, sin)
        out[f"moe.{i}"] = ref.moe(i, x)
    return out


def tp_rank(ctx: RankContext, model_dir: str, layers: list[int], alignment: int, tokens: int, seed: int,
            mutation: str | None = None) -> bytes | None:
    """A rank function for `distributed.launch`: this rank's partial outputs, all-reduced (as vLLM's
    RowParallelLinear and FusedMoE reduce them); rank 0 sends the sums back (torch.save bytes)."""
    import torch.distributed as dist

    ref = Reference(model_dir)
    plan = plan_for(ref.cfg, ctx.world_size, ctx.rank, is_mxfp4(ref), alignment, mutation)
    shard = shard_reference(ref, plan)
    ctx.progress(f"rank holds heads {plan.heads}, kv {plan.kv_heads}, intermediate {plan.inter}")
    partial = layer_outputs(shard, layers, tokens, seed)
    for name, t in partial.items():
        if not (name.startswith("attention") and mutation == "o_proj_not_reduced"):
            ctx.progress(f"all_reduce {name}")
            dist.all_reduce(t)
    if ctx.rank != 0:
        return None
    buf = io.BytesIO()
    torch.save(partial, buf)
    return buf.getvalue()


def recombined_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], rel_tol: float,
                     label: str) -> VerdictReport:
    """Each recombined output against the unsharded one: max |Δ| / max |unsharded| within rel_tol."""
    report = VerdictReport(f"TP sharding {label}", require_figures=True)
    worst: dict[str, float] = {}
    for name, w in want.items():
        g = got.get(name)
        if g is None or g.shape != w.shape:
            report.problems.append(f"{name}: recombined shape {None if g is None else tuple(g.shape)}, "
                                   f"unsharded {tuple(w.shape)}")
            continue
        rel = (g - w).abs().max().item() / (w.abs().max().item() or 1.0)
        rel = rel if math.isfinite(rel) else float("inf")
        kind = name.split(".")[0]
        worst[kind] = max(worst.get(kind, 0.0), rel)
        if not rel <= rel_tol:
            report.problems.append(f"{name}: max |Δ| / max |unsharded| = {rel:.3g} exceeds {rel_tol:.3g}")
    report.measured = {f"{k}_max_rel_err": v for k, v in worst.items()}
    report.judged_by = {f"{k}_max_rel_err": FigureLimit(rel_tol, "max", "distributed.toml tp.rel_tol") for k in worst}
    return report


def load_outputs(blob: bytes) -> dict[str, torch.Tensor]:
    return torch.load(io.BytesIO(blob), weights_only=True)
