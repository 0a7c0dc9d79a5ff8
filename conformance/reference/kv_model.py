"""The paged KV cache a model's config implies, recomputed from config.json alone: the closed-form
expectation the KV accounting checks hold the engine's allocator to
(docs/architecture.md "Rule 3: an independent reference").

vLLM 0.32 (v1/core/kv_cache_utils.py, single_type_kv_cache_manager.py) allocates as follows, and
this module restates it without importing vLLM:

* one page = one block of one layer = 2 (K and V) x block_size x num_kv_heads x head_dim x dtype bytes;
* layers are bucketed by attention type (sliding window W / full); with equal page sizes each bucket
  is split into groups of `group_size` layers, group_size = the smallest bucket, or the largest when
  it is under 1.5x the smallest (gpt-oss alternates 1:1, so: one sliding group, one full group);
* all groups draw block ids from ONE shared pool whose block is group_size pages wide, so
  num_blocks = budget // (group_size x page), or num_gpu_blocks_override; one null block is reserved;
* a request holds ceil(computed / block_size) blocks in a full-attention group; a sliding group
  frees every block that lies wholly before the window of the last computed token, i.e. it holds
  ceil(C / bs) - floor(max(0, C - W) / bs) after a decode step (C = computed tokens).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


class KVConfigError(ValueError):
    """The model config lacks what the KV expectation needs."""


@dataclass(frozen=True)
class ExpectedGroup:
    kind: str                      # "sliding" | "full"
    layers: tuple[int, ...]
    sliding_window: int | None


@dataclass
class ExpectedKV:
    block_size: int
    page_size_bytes: int
    group_size: int
    bytes_per_block: int
    num_blocks: int | None         # None when the budget is unknown
    groups: list[ExpectedGroup] = field(default_factory=list)


def kv_dtype_bytes(model_dtype: str, kv_cache_dtype: str | None = None) -> int:
    name = model_dtype if kv_cache_dtype in (None, "auto") else kv_cache_dtype
    if name not in DTYPE_BYTES:
        raise KVConfigError(f"no byte size known for KV dtype {name!r}: add it to DTYPE_BYTES")
    return DTYPE_BYTES[name]


def layer_kinds(config: dict) -> list[str]:
    """'sliding' or 'full' per decoder layer, from config.json's layer_types (gpt-oss writes it)."""
    types = config.get("layer_types")
    if not types:
        raise KVConfigError("config.json has no layer_types: cannot tell sliding from full layers")
    if len(types) != int(config["num_hidden_layers"]):
        raise KVConfigError(f"layer_types has {len(types)} entries for {config['num_hidden_layers']} layers")
    return ["sliding" if "sliding" in t else "full" for t in types]


def page_size_bytes(config: dict, block_size: int, dtype_bytes: int) -> int:
    head_dim = int(config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"])
    return 2 * block_size * int(config["num_key_value_heads"]) * head_dim * dtype_bytes


def expected_kv(config: dict, block_size: int, dtype_bytes: int, budget_bytes: int | None,
                num_blocks_override: int | None = None) -> ExpectedKV:
    kinds = layer_kinds(config)
    buckets: dict[str, list[int]] = {}
    for i, kind in enumerate(kinds):
        buckets.setdefault(kind, []).append(i)
    sizes = [len(v) for v in buckets.values()]
    group_size = max(sizes) if max(sizes) < 1.5 * min(sizes) else min(sizes)
    groups = []
    for kind, layers in buckets.items():
        n_groups = math.ceil(len(layers) / group_size)
        window = int(config["sliding_window"]) if kind == "sliding" else None
        groups += [ExpectedGroup(kind, tuple(layers[g::n_groups]), window) for g in range(n_groups)]
    page = page_size_bytes(config, block_size, dtype_bytes)
    per_block = group_size * page
    if num_blocks_override is not None:
        num_blocks: int | None = int(num_blocks_override)
    else:
        num_blocks = budget_bytes // per_block if budget_bytes is not None else None
    return ExpectedKV(block_size, page, group_size, per_block, num_blocks, groups)


def layer_index(name: str) -> int:
    m = re.search(r"layers\.(\d+)\.", name)
    if not m:
        raise KVConfigError(f"cannot read a layer index from the engine's layer name {name!r}")
    return int(m.group(1))


def blocks_needed(kind: str, computed_tokens: int, block_size: int, window: int | None,
                  after_decode: bool) -> int:
    """Blocks a request with `computed_tokens` in its KV must hold in a group of this kind.

    Right after a prefill nothing has left the window yet (vLLM frees lazily at the next allocation);
    after a decode step a sliding group holds only the blocks that touch the last token's window."""
    full = math.ceil(computed_tokens / block_size)
    if kind != "sliding" or not after_decode or window is None:
        return full
    return full - max(0, computed_tokens - window) // block_size
