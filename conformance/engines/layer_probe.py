"""Per-layer probe: the inputs and outputs of every attention and MoE block of the engine during a real
prefill and greedy decode, so each block can be compared alone with the fp64 reference on the engine's
own inputs. No error is carried from layer to layer, so bf16/fp16 noise stays one block deep while a bug
shows in the block, layer type, position band and phase where it lives (docs/verdicts.md)."""

from __future__ import annotations

from typing import Any

import torch


def _record(store: list, x: torch.Tensor, y: torch.Tensor, positions: torch.Tensor | None) -> None:
    # clone: engines reuse their input buffers (vLLM's positions), and .cpu()/.long() may return the same tensor
    flat = [t.detach().reshape(-1, t.shape[-1]).double().cpu().clone() for t in (x, y)]
    store.append((*flat, None if positions is None else positions.detach().reshape(-1).long().cpu().clone()))


def _assemble(calls: dict[str, list], layers: list[int], prefill_len: int) -> dict[str, Any]:
    """Concatenate the calls of each probed block in order (`layers`: the indices probed, in order; out["attn"][n]
    is layer layers[n]'s); positions come from the engine where it passes them."""
    out: dict[str, Any] = {"prefill_len": prefill_len, "attn": [], "moe": [], "layers": list(layers)}
    for block in ("attn", "moe"):
        for i in layers:
            parts = calls[f"{block}{i}"]
            x = torch.cat([p[0] for p in parts]) if parts else torch.empty(0)
            y = torch.cat([p[1] for p in parts]) if parts else torch.empty(0)
            out[block].append((x, y))
    first = calls.get(f"attn{layers[0]}") if layers else None
    if first and all(p[2] is not None for p in first):
        out["positions"] = torch.cat([p[2] for p in first]).tolist()
    else:
        out["positions"] = list(range(int(out["attn"][0][0].shape[0]) if out["attn"] else 0))
    return out


def _probed(count: int, layers: list[int] | None) -> list[int]:
    """The layer indices to hook: `layers` (those in range, in order), or every one of the model's `count`."""
    return list(range(count)) if layers is None else sorted({i for i in layers if 0 <= i < count})


def _hf_layer_io(engine: Any, prompt: list[int], decode_steps: int, only: list[int] | None) -> dict[str, Any]:
    model, torch_ = engine.model, engine.torch
    probed = _probed(len(model.model.layers), only)
    layers = {i: model.model.layers[i] for i in probed}
    calls: dict[str, list] = {f"{b}{i}": [] for b in ("attn", "moe") for i in probed}

    def hook(name: str) -> Any:
        def record(mod: Any, args: tuple, kwargs: dict, output: Any) -> None:
            x = kwargs.get("hidden_states", args[0] if args else None)
            _record(calls[name], x, output[0] if isinstance(output, tuple) else output, None)
        return record

    handles = [layer.self_attn.register_forward_hook(hook(f"attn{i}"), with_kwargs=True) for i, layer in
               layers.items()]
    handles += [layer.mlp.register_forward_hook(hook(f"moe{i}"), with_kwargs=True) for i, layer in layers.items()]
    try:
        with torch_.no_grad():
            ids = torch_.tensor([prompt], device=engine.device)
            out = model(ids, use_cache=True)
            for _ in range(decode_steps):
                token = out.logits[:, -1:].argmax(-1)
                out = model(token, past_key_values=out.past_key_values, use_cache=True)
    finally:
        for h in handles:
            h.remove()
    return _assemble(calls, probed, len(prompt))


_VLLM_CALLS: dict[str, list] = {}


def _vllm_layer_io(engine: Any, prompt: list[int], decode_steps: int, only: list[int] | None) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    def attach(model: Any) -> list[int]:
        _VLLM_CALLS.clear()
        handles = []
        probed = _probed(len(model.model.layers), only)
        for i in probed:
            layer = model.model.layers[i]
            for block, mod in (("attn", layer.attn), ("moe", layer.mlp)):
                store = _VLLM_CALLS.setdefault(f"{block}{i}", [])

                def record(m: Any, args: tuple, output: Any, store: list = store, block: str = block) -> None:
                    _record(store, args[0], output, args[1] if block == "attn" and len(args) > 1 else None)
                handles.append(mod.register_forward_hook(record))
        model._conformance_probe_handles = handles
        return probed

    def detach(model: Any) -> None:
        for h in getattr(model, "_conformance_probe_handles", []):
            h.remove()
        model._conformance_probe_handles = []

    engine.llm.reset_prefix_cache()  # a cached prefix would skip the prompt's forward
    layers = engine.llm.apply_model(attach)[0]
    try:
        engine.llm.generate([TokensPrompt(prompt_token_ids=prompt)],
                            SamplingParams(max_tokens=decode_steps + 1, temperature=0.0, detokenize=False),
                            use_tqdm=False)
        calls = {k: list(v) for k, v in _VLLM_CALLS.items()}
    finally:
        engine.llm.apply_model(detach)
    return _assemble(calls, layers, len(prompt))


def layer_io(engine: Any, prompts: list[list[int]], decode_steps: int,
             layers: list[int] | None = None) -> list[dict[str, Any]]:
    """Per prompt: positions, prefill length, the layers probed (`layers`, default every one) and for each the
    (input, output) [N, H] fp64 of its attention block and of its MoE block, over the prompt's prefill and
    `decode_steps` greedy decode steps."""
    fn = _vllm_layer_io if hasattr(engine, "llm") else _hf_layer_io
    return [fn(engine, p, decode_steps, layers) for p in prompts]
