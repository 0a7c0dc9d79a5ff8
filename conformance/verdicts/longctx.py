"""Check bodies of the long-context checks (checks/test_long_context.py): deep prompts, comparison of the
band past the original context against the fp64 reference, figures per position band."""

from __future__ import annotations

from dataclasses import dataclass

from conformance.engines.base import Completion
from conformance.verdicts import compare

BANDS = ((0, 4096), (4096, 8192), (8192, 16384), (16384, 32768), (32768, 1 << 30))


@dataclass(frozen=True)
class LongSettings:
    prompt_tokens: int
    band_from: int
    decode_tokens: int
    chunk_tokens: int
    seed: int


def settings_() -> LongSettings:
    from conformance.verdicts import profiles

    row = profiles.data()["long_context_checks"]
    return LongSettings(int(row["prompt_tokens"]), int(row["band_from"]), int(row["decode_tokens"]),
                        int(row["chunk_tokens"]), int(row["seed"]))


def deep_prompt(vocab_size: int, tokens: int, seed: int) -> list[int]:
    """Random ids (fixed seed) below the tiny vocab's two special ids: no structure a cache could shortcut."""
    import random

    rng = random.Random(seed)
    return [rng.randrange(vocab_size - 2) for _ in range(tokens)]


def band_of(got: Completion, start: int) -> Completion:
    """The engine's completion with only the prompt steps that predict tokens start+1 .. (as score_from)."""
    return Completion(got.prompt_ids, got.token_ids, got.steps, got.prompt_steps[start:])


def depth_parity(got: list[Completion], want: list[Completion], tol: compare.LogprobTolerance, start: int,
                 names: tuple[str, str] = ("engine", "reference")) -> compare.ParityReport:
    """compare.logprobs_close over the band from `start` on (prompt steps there, then every decode step);
    `want` comes from LongReference.score_from(..., start)."""
    report = compare.logprobs_close([band_of(g, start) for g in got], want, tol, names)
    if got and got[0].prompt_steps and len(got[0].prompt_steps) < len(got[0].prompt_ids) - 1:
        report.problems.append(f"{names[0]} returned {len(got[0].prompt_steps)} prompt steps for a "
                               f"{len(got[0].prompt_ids)}-token prompt")
    return report


def band_figures(got: Completion, want: Completion, start: int) -> dict[str, float]:
    """max |Δlogprob| per band of prompt positions (the depth at which an error appears)."""
    out: dict[str, float] = {}
    for pos, (gs, ws) in enumerate(zip(got.prompt_steps[start:], want.prompt_steps), start=start):
        d = max((abs(gs.top[t] - ws.top[t]) for t in gs.top if t in ws.top), default=float("nan"))
        lo, hi = next(b for b in BANDS if b[0] <= pos < b[1])
        key = f"max_abs_dlogprob_{lo // 1024}k_{hi // 1024}k" if hi < 1 << 30 else f"max_abs_dlogprob_{lo // 1024}k_"
        out[key] = max(out.get(key, 0.0), d)
    return out



def max_len_problems(limits: dict, want_len: int, out: list[Completion], decode: int) -> list[str]:
    """What is wrong with a request at max_model_len: the engine's limit, the tokens and their logprobs."""
    import math

    problems = []
    if int(limits.get("max_model_len", -1)) != want_len:
        problems.append(f"the engine runs max_model_len {limits.get('max_model_len')}, the profile asks for "
                        f"{want_len}")
    if not out or len(out[0].token_ids) != decode:
        got = len(out[0].token_ids) if out else 0
        problems.append(f"the request at max_model_len decoded {got} of {decode} tokens")
    bad = [s for c in out for s in c.steps if not all(math.isfinite(v) for v in s.top.values())]
    if bad:
        problems.append(f"{len(bad)} decode step(s) at max_model_len have non-finite logprobs")
    return problems


@dataclass(frozen=True)
class PreemptionSettings:
    requests: tuple[tuple[int, int], ...]   # slices of the deep prompt; the first is the whole of it
    chunk_tokens: int
    block_size: int
    spare_blocks: int
    engine: dict


def preemption_settings() -> PreemptionSettings:
    from conformance.verdicts import profiles

    row = profiles.data()["long_context_checks"]["preemption"]
    return PreemptionSettings(tuple((int(a), int(b)) for a, b in row["requests"]), int(row["chunk_tokens"]),
                              int(row["block_size"]), int(row["spare_blocks"]), dict(row["engine"]))


def preemption_requests(deep: list[int], ps: PreemptionSettings) -> list[list[int]]:
    reqs = [deep[a:b] for a, b in ps.requests]
    if not reqs or reqs[0] != deep:
        raise ValueError("long_context_checks.preemption.requests must start with the whole deep prompt "
                         f"[0, {len(deep)}] (data/profiles.toml)")
    return reqs


def preemption_options(long_options: dict, deep_tokens: int, decode_tokens: int, window: int,
                       ps: PreemptionSettings, profile_block_size: int | None = None,
                       batches_in_flight: int = 1) -> dict:
    """The long-context engine cut down to a KV pool that holds one request of the deep prompt and little
    more: max_model_len = the deep prompt + its decode, rounded up to a block; blocks = that request's
    full-attention blocks + the sliding-window blocks of the chunks in flight (what vLLM requires to start) +
    spare. vLLM sizes the sliding window for every batch scheduled but not yet settled: one, or two where it
    schedules asynchronously, as on GPUs (VllmConfig.max_in_flight_tokens; SlidingWindowSpec.
    max_admission_blocks_per_request: cdiv(window - 1 + in-flight tokens, block) + 1). First contact on the H200:
    a pool sized for one chunk refused to start. The profile's block size where it sets one (a backend may
    support only some), else the data's."""
    bs = int(profile_block_size or ps.block_size)
    max_len = -(-(deep_tokens + decode_tokens) // bs) * bs
    blocks = max_len // bs + -(-(batches_in_flight * ps.chunk_tokens + window) // bs) + ps.spare_blocks
    return dict(long_options) | ps.engine | {"max_model_len": max_len, "block_size": bs,
                                             "num_gpu_blocks_override": blocks,
                                             "max_num_batched_tokens": ps.chunk_tokens, "enable_chunked_prefill": True}


def without_prompt_steps(c: Completion) -> Completion:
    return Completion(c.prompt_ids, c.token_ids, c.steps)
