"""What a vLLM worker holds of its tensor-parallel shards, read inside the worker (through `LLM.apply_model`);
judged against the reference by conformance/distributed/tp_shards.py."""

from __future__ import annotations

from typing import Any

CONTENT_SUFFIXES = ("attn.qkv_proj.weight", "attn.qkv_proj.bias", "attn.o_proj.weight", "attn.o_proj.bias",
                    "attn.sinks", "mlp.router.weight", "mlp.router.bias", "embedding.weight", "lm_head.weight")


def read_shards(model: Any) -> dict[str, Any]:
    """Inside one vLLM worker: its TP rank and world size, the sharded tensors it holds (CPU, as held)
    and the shapes of the expert weights."""
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    tensors, shapes, repacked = {}, {}, []
    for name, p in model.named_parameters():
        if name.endswith(CONTENT_SUFFIXES):
            if p.numel():
                tensors[name] = p.detach().cpu().clone()
            else:  # vLLM-CPU's GEMM dispatch keeps only a packed copy (remove_weight=True)
                repacked.append(name)
        elif "experts." in name:
            shapes[name] = tuple(p.shape)
    return {"rank": get_tensor_model_parallel_rank(), "world_size": get_tensor_model_parallel_world_size(),
            "tensors": tensors, "shapes": shapes, "repacked": repacked}
