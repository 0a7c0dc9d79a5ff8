"""Faults planted inside an engine under test, for the suite's own negative controls only: each one edits
the engine's real code path after loading (transformers' gpt_oss modules, vLLM's model in the worker), so a
control proves that a check rejects an engine that computes this mistake. A run never plants one unless a
control asks (engine option `planted_fault`); the engine's info then names it."""

from __future__ import annotations

from typing import Any

import torch


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(t.dtype)


def _rebuild_vllm_cache(rot: Any, positions: torch.Tensor | None = None, round_inv_freq: bool = False) -> None:
    """Recompute vLLM's cos/sin cache from its own table: recover inv_freq (position 1) and the
    concentration (position 0) in fp64, then apply the fault to positions or inv_freq."""
    cache = rot.cos_sin_cache
    table = cache.double()
    half = table.shape[-1] // 2
    conc = table[0, :half]
    inv = torch.atan2(table[1, half:], table[1, :half])
    if round_inv_freq:
        inv = inv.float().to(torch.bfloat16).double()
    # on the cache's device: a GPU engine's table lives there (first contact on the H200: "Expected all tensors to
    # be on the same device" from positions built on the CPU)
    pos = torch.arange(table.shape[0], dtype=torch.float64) if positions is None else positions
    angles = pos.to(table.device)[:, None] * inv[None, :]
    # in place: a GPU engine's captured graphs and compiled code read this very storage (a new tensor would be missed);
    # under inference mode: an eager engine's cache may be an inference tensor (first contact on the H200, the
    # per-layer probe's engine: "Inplace update to inference tensor outside InferenceMode is not allowed")
    with torch.inference_mode():
        cache.copy_(torch.cat([angles.cos() * conc, angles.sin() * conc], dim=-1).to(cache.dtype))


def _vllm_sampler(name: str) -> None:
    """Faults of vLLM's sampler and stop rule, planted in the classes and modules the in-process engine core calls
    (VLLM_ENABLE_V1_MULTIPROCESSING=0: this process): each is a mistake that shipped in some serving stack."""
    import dataclasses

    from vllm.v1.core.sched import scheduler
    from vllm.v1.sample import sampler
    from vllm.v1.sample.ops import topk_topp_sampler as ops

    if name == "temperature_ignored":
        sampler.Sampler.apply_temperature = staticmethod(lambda logits, temp, all_random: logits)
    elif name in ("nucleus_not_applied", "top_k_off_by_one"):
        apply = ops.apply_top_k_top_p

        def truncate(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
            if name == "nucleus_not_applied":
                return apply(logits, k, None)
            return apply(logits, None if k is None else k + 1, p)
        ops.apply_top_k_top_p = truncate
    elif name == "seed_dropped":
        sample = sampler.Sampler.sample

        def unseeded(self: Any, logits: torch.Tensor, metadata: Any, *args: Any, **kwargs: Any) -> Any:
            return sample(self, logits, dataclasses.replace(metadata, generators={}), *args, **kwargs)
        sampler.Sampler.sample = unseeded
    elif name == "max_tokens_off_by_one":
        check_stop = scheduler.check_stop

        def late(request: Any, *args: Any, **kwargs: Any) -> Any:
            request.max_tokens += 1
            try:
                return check_stop(request, *args, **kwargs)
            finally:
                request.max_tokens -= 1
        scheduler.check_stop = late
    else:
        raise ValueError(f"unknown planted fault {name!r} for vLLM")


SAMPLER_FAULTS = ("temperature_ignored", "nucleus_not_applied", "top_k_off_by_one", "seed_dropped",
                  "max_tokens_off_by_one")

# Logit drift per request the engine has served (history_drift): over the dozen requests between two probes of
# conformance/checks/test_request_history.py a top-5 logprob moves by up to ~0.1 nats, a drift of the size
# vllm-project/vllm#57493's users saw, which hides inside bf16's limits against the reference.
HISTORY_DRIFT_PER_REQUEST = 5e-3
HISTORY_FAULTS = ("history_drift",)


def _vllm_history_drift(engine: Any) -> None:
    """Logits that drift with the number of requests the engine has been given: each request the scheduler admits
    adds HISTORY_DRIFT_PER_REQUEST x a fixed pattern over the vocabulary (cos 0.7 t, so log-softmax moves) to every
    logit computed after it, in float32. The counter lives in this process: the model runs here (executor uni,
    in-process engine core, as the suite's engines run)."""
    from vllm.v1.core.sched import scheduler

    served = [0]
    add = scheduler.Scheduler.add_request

    def counted(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        served[0] += 1
        return add(self, request, *args, **kwargs)
    scheduler.Scheduler.add_request = counted

    def edit(model: Any) -> None:
        compute = model.compute_logits

        def drifted(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            logits = compute(hidden_states, *args, **kwargs)
            vocab = torch.arange(logits.shape[-1], device=logits.device, dtype=torch.float32)
            return logits.float() + HISTORY_DRIFT_PER_REQUEST * served[0] * torch.cos(0.7 * vocab)
        model.compute_logits = drifted

    engine.llm.apply_model(edit)


# A MoE kernel path taken above a number of tokens per forward that computes wrong there (moe_wrong_above_512_tokens),
# the shape of vllm-project/vllm#44679 (AITER dispatching another MoE kernel at another shape): every forward of more
# than MOE_SWITCH_TOKENS tokens gets each MoE block's output scaled by MOE_SWITCH_SCALE (a path that loses part of its
# reduction); forwards up to it are exact. The MoE block check's fixed sizes (1, 7, 128, 129, 512) all stay below it.
MOE_SWITCH_TOKENS = 512
MOE_SWITCH_SCALE = 0.875
SHAPE_FAULTS = ("moe_wrong_above_512_tokens",)


def moe_switch(threshold: int, scale: float, model: Any) -> None:
    """Each MoE block of `model` scales its output by `scale` in a forward of more than `threshold` tokens. A module
    function of its arguments alone: vLLM pickles it to every rank's worker at TP > 1 (apply_model)."""
    for layer in model.model.layers:
        mlp = layer.mlp
        forward = mlp.forward

        def switched(x: torch.Tensor, *args: Any, forward: Any = forward, **kwargs: Any) -> torch.Tensor:
            out = forward(x, *args, **kwargs)
            return out * scale if x.shape[0] > threshold else out
        mlp.forward = switched


# RoPE that goes wrong only deep into a sequence (rope_clamped_past_16k): every cos/sin row of vLLM's table from
# ROPE_CLAMPED_FROM on repeats the row before it, as a table built or indexed for a shorter context would; the rows
# below are vLLM's own, untouched, so a check whose prompts stop short of 16384 tokens sees the exact engine.
ROPE_CLAMPED_FROM = 16384
DEPTH_FAULTS = ("rope_clamped_past_16k",)


def rope_clamped(start: int, model: Any) -> None:
    """Each layer's RoPE table of `model` clamped at position `start` - 1, in place (captured graphs and compiled code
    read this very storage). A module function of its arguments alone: vLLM pickles it to every rank at TP > 1."""
    for layer in model.model.layers:
        cache = layer.attn.rotary_emb.cos_sin_cache
        with torch.inference_mode():
            cache[start:].copy_(cache[start - 1].expand_as(cache[start:]).clone())


def _vllm(engine: Any, name: str) -> None:
    if name in SAMPLER_FAULTS:
        return _vllm_sampler(name)
    if name in DEPTH_FAULTS:
        import functools

        engine.llm.apply_model(functools.partial(rope_clamped, ROPE_CLAMPED_FROM))
        return None
    if name in HISTORY_FAULTS:
        return _vllm_history_drift(engine)
    if name in SHAPE_FAULTS:
        import functools

        engine.llm.apply_model(functools.partial(moe_switch, MOE_SWITCH_TOKENS, MOE_SWITCH_SCALE))
        return None

    def edit(model: Any) -> None:
        for layer in model.model.layers:
            rot = layer.attn.rotary_emb
            if name == "rope_bf16_positions":
                n = rot.cos_sin_cache.shape[0]
                _rebuild_vllm_cache(rot, positions=_bf16(torch.arange(n, dtype=torch.float32)).double())
            elif name == "rope_bf16_inv_freq":
                _rebuild_vllm_cache(rot, round_inv_freq=True)
            elif name == "sinks_dropped":
                layer.attn.sinks.data.fill_(float("-inf"))
            else:
                raise ValueError(f"unknown planted fault {name!r} for vLLM")

    engine.llm.apply_model(edit)


def _transformers(engine: Any, name: str) -> None:
    model = engine.model
    rot = model.model.rotary_emb
    if name == "rope_bf16_positions":
        forward = rot.forward

        def rounded(x: torch.Tensor, position_ids: torch.Tensor) -> Any:
            return forward(x, position_ids.to(torch.bfloat16).to(position_ids.dtype))
        rot.forward = rounded
    elif name == "rope_bf16_inv_freq":
        rot.inv_freq = rot.inv_freq.to(torch.bfloat16).float()
    elif name == "sinks_dropped":
        for layer in model.model.layers:
            layer.self_attn.sinks.data.fill_(float("-inf"))
    elif name == "expert_bias_dropped":
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj_bias.data.zero_()
            layer.mlp.experts.down_proj_bias.data.zero_()
    elif name == "routing_not_renormalised":
        for layer in model.model.layers:
            router = layer.mlp.router

            def route(hidden: torch.Tensor, router: Any = router) -> Any:
                logits = torch.nn.functional.linear(hidden, router.weight, router.bias)
                probs = torch.softmax(logits.float(), dim=-1)
                scores, idx = torch.topk(probs, router.top_k, dim=-1)
                return logits, scores.to(logits.dtype), idx
            router.forward = route
    else:
        raise ValueError(f"unknown planted fault {name!r} for transformers")


# model math; SAMPLER_FAULTS are vLLM's sampler and stop rule, HISTORY_FAULTS the state it keeps between requests
FAULTS = ("rope_bf16_positions", "rope_bf16_inv_freq", "sinks_dropped", "routing_not_renormalised",
          "expert_bias_dropped")


def plant(engine: Any, name: str) -> None:
    """Edit the loaded engine so it computes the named mistake."""
    (_vllm if hasattr(engine, "llm") else _transformers)(engine, name)
