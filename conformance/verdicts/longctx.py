"""Check bodies of the long-context checks (checks/test_long_context.py): deep prompts, comparison of the
band past the original context against the fp64 reference, figures per position band."""

from __future__ import annotations

from dataclasses import dataclass

from conformance.engines.base import Completion
from conformance.verdicts import compare

BANDS = ((0, 4096), (4096, 8192), (8192, 16384), (16384, 32768), (32768, 65536), (65536, 131072), (131072, 1 << 30))
# the position bands past compare.POSITION_BANDS' last (4096) that the strata at max_model_len are named by
LIMIT_BANDS = (8192, 16384, 32768, 65536, 131072)


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
        key = _band_key(pos)
        out[key] = max(out.get(key, 0.0), d)
    return out



@dataclass(frozen=True)
class LimitSettings:
    """The requests at the profile's max_model_len (data/profiles.toml [long_context_checks.at_limit])."""

    decode_tokens: int
    sampled_positions: int
    boundaries: tuple[int, ...]
    seed: int
    unchunked_kv_factor: int


def limit_settings() -> LimitSettings:
    from conformance.verdicts import profiles

    row = profiles.data()["long_context_checks"]["at_limit"]
    return LimitSettings(int(row["decode_tokens"]), int(row["sampled_positions"]),
                         tuple(int(b) for b in row["boundaries"]), int(row["seed"]), int(row["unchunked_kv_factor"]))


def limit_prompt(vocab_size: int, max_model_len: int, ls: LimitSettings) -> list[int]:
    """The prompt that fills max_model_len but the tokens the request decodes."""
    return deep_prompt(vocab_size, max_model_len - ls.decode_tokens, ls.seed)


def sampled_positions(prompt_tokens: int, ls: LimitSettings) -> list[int]:
    """The prompt positions judged against the reference (each one's next-token logprobs, predicting the token after
    it): one at random (seeded) in each of `sampled_positions` equal strata of [0, prompt_tokens - 1), so they spread
    over the whole length at offsets that vary against any block or chunk size, and both sides of each boundary the
    prompt crosses (the original context, the powers of two where tables and kernels switch)."""
    import random

    last = prompt_tokens - 1  # position last - 1 predicts the prompt's final token
    rng = random.Random(ls.seed)
    count = min(ls.sampled_positions, last)
    picked = {int(i * last / count) + rng.randrange(max(1, int((i + 1) * last / count) - int(i * last / count)))
              for i in range(count)}
    picked |= {p for b in ls.boundaries for p in (b - 1, b) if 0 <= p < last}
    return sorted(picked)


def _band_key(pos: int) -> str:
    lo, hi = next(b for b in BANDS if b[0] <= pos < b[1])
    return f"max_abs_dlogprob_{lo // 1024}k_{hi // 1024}k" if hi < 1 << 30 else f"max_abs_dlogprob_{lo // 1024}k_"


def at_positions(got: Completion, positions: list[int]) -> Completion:
    """The engine's completion with only the prompt steps at `positions` (as LongReference.score_at returns them)."""
    steps = got.prompt_steps
    return Completion(got.prompt_ids, got.token_ids, got.steps,
                      [steps[p] for p in positions if p < len(steps)])


def sampled_parity(got: list[Completion], want: list[Completion], positions: list[int],
                   tol: compare.LogprobTolerance, names: tuple[str, str] = ("engine", "reference")
                   ) -> compare.ParityReport:
    """compare.logprobs_close over the prompt steps at the sampled `positions` and every decode step; `want` comes
    from LongReference.score_at(..., positions). The strata are named by the positions themselves."""
    report = compare.logprobs_close([at_positions(g, positions) for g in got], want, tol, names,
                                    prompt_positions=positions, bands=compare.POSITION_BANDS + LIMIT_BANDS)
    short = [g for g in got if len(g.prompt_steps) < len(g.prompt_ids) - 1]
    if short:
        report.problems.append(f"{names[0]} returned {len(short[0].prompt_steps)} prompt steps for a "
                               f"{len(short[0].prompt_ids)}-token prompt")
    elif report.problems and got and want:  # where along the length it goes wrong
        bands = sampled_band_figures(got[0], want[0], positions)
        report.problems.append("max |Δlogprob| by position band: " + ", ".join(
            f"{k.removeprefix('max_abs_dlogprob_')} {v:.3g}" for k, v in bands.items()))
    return report


def sampled_band_figures(got: Completion, want: Completion, positions: list[int]) -> dict[str, float]:
    """max |Δlogprob| per band of the sampled prompt positions, then of the decode steps (`max_abs_dlogprob_decode`):
    where along the length an error appears."""
    out: dict[str, float] = {}
    for pos, gs, ws in zip(positions, [got.prompt_steps[p] for p in positions], want.prompt_steps):
        d = max((abs(gs.top[t] - ws.top[t]) for t in gs.top if t in ws.top), default=float("nan"))
        out[_band_key(pos)] = max(out.get(_band_key(pos), 0.0), d)
    for gs, ws in zip(got.steps, want.steps):
        d = max((abs(gs.top[t] - ws.top[t]) for t in gs.top if t in ws.top), default=float("nan"))
        out["max_abs_dlogprob_decode"] = max(out.get("max_abs_dlogprob_decode", 0.0), d)
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
