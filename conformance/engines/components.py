"""Component probes: reach inside the engine under test for one layer (RoPE tables, the MoE block)
so the math can be compared piece by piece with the fp64 reference. Called in the engine child
process through `EngineProcess.call("components:<name>", ...)`; each returns CPU float64 tensors."""

from __future__ import annotations

from typing import Any

import torch


def _apply(engine: Any, fn: Any) -> Any:
    """Run fn(model) where the engine keeps its model (vLLM: the worker; transformers: in process)."""
    if hasattr(engine, "llm"):
        return engine.llm.apply_model(fn)[0]
    return fn(engine.model)


def rope_tables(engine: Any, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [P, head_dim/2] the engine multiplies q and k with (concentration included)."""
    pos = torch.tensor(positions)

    def vllm_tables(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
        cache = model.model.layers[0].attn.rotary_emb.cos_sin_cache.to(torch.float64).cpu()
        cos, sin = cache[pos].chunk(2, dim=-1)
        return cos, sin

    def hf_tables(model: Any) -> tuple[torch.Tensor, torch.Tensor]:
        rot = model.model.rotary_emb
        dummy = torch.zeros(1, dtype=model.dtype, device=model.device)
        cos, sin = rot(dummy, pos[None].to(model.device))
        half = model.config.head_dim // 2  # some models return [cos, cos] over head_dim, gpt-oss only half
        return cos[0, :, :half].double().cpu(), sin[0, :, :half].double().cpu()

    return _apply(engine, vllm_tables if hasattr(engine, "llm") else hf_tables)


def moe_block(engine: Any, layer: int, x: torch.Tensor) -> torch.Tensor:
    """The engine's MoE block (router + experts + weighted sum) on normalised hidden states [M, H]."""

    def vllm_moe(model: Any) -> torch.Tensor:
        from vllm.forward_context import set_forward_context

        block = model.model.layers[layer].mlp
        param = next(block.parameters())
        with torch.no_grad(), set_forward_context(None, engine.llm.llm_engine.vllm_config):
            return block(x.to(param.dtype).to(param.device)).double().cpu()

    def hf_moe(model: Any) -> torch.Tensor:
        block = model.model.layers[layer].mlp
        param = next(block.parameters())
        with torch.no_grad():
            out = block(x.to(param.dtype).to(param.device)[None])
        return (out[0] if isinstance(out, tuple) else out)[0].double().cpu()

    return _apply(engine, vllm_moe if hasattr(engine, "llm") else hf_moe)


def generate(engine: Any, prompts: list[list[int]], params: dict[str, Any]) -> list[dict[str, Any]]:
    """vLLM generate with arbitrary sampling parameters: token ids and finish reason per prompt."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    outs = engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                               SamplingParams(detokenize=False, **params), use_tqdm=False)
    return [{"token_ids": list(o.outputs[0].token_ids), "finish_reason": o.outputs[0].finish_reason,
             "stop_reason": o.outputs[0].stop_reason} for o in outs]


def process_usage(engine: Any) -> dict[str, float]:
    """RSS (MiB) and open file descriptors of the engine process, from /proc (Linux)."""
    import os
    import sys

    rss = 0.0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    usage = {"rss_mib": rss, "open_fds": float(len(os.listdir("/proc/self/fd")))}
    torch = sys.modules.get("torch")  # GPU engines: the caching allocator's reserved memory, all devices
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        usage["vram_mib"] = sum(torch.cuda.memory_reserved(i) for i in range(torch.cuda.device_count())) / 2**20
    return usage


# --- Quantized loading: which quantization method and kernel the engine chose per layer. ---
def _describe(value: Any) -> str:
    if isinstance(value, type):
        return value.__name__
    if isinstance(value, str):
        return value
    name = getattr(value, "name", None)  # enums: Mxfp4MoeBackend.AITER_MXFP4_FP8, WNA16MoEBackend.CPU
    return str(name) if isinstance(name, str) else type(value).__name__


def quant_methods(engine: Any) -> dict[str, str]:
    """{module name: "QuantMethod[/Scheme][/Kernel][/Backend]"} for the linear and MoE layers of the engine's
    model (vLLM: each layer's quant_method, scheme and the kernel or backend it chose; transformers: the module
    classes, which is where its quantizers show)."""

    def vllm_methods(model: Any) -> dict[str, str]:
        found: dict[str, str] = {}
        for name, mod in model.named_modules():
            method = getattr(mod, "quant_method", None)
            if method is None or not name.startswith("model.layers.") or name.endswith(".attn"):
                continue
            parts = [type(method).__name__]
            scheme = getattr(mod, "scheme", None)
            if scheme is not None:
                parts.append(type(scheme).__name__)
                inner = getattr(scheme, "fp8_linear", None) or getattr(scheme, "kernel", None)
                if inner is not None:
                    parts.append(_describe(inner))
            for attr in ("kernel", "mxfp4_backend", "wna16_moe_backend", "fp8_backend", "experts_cls"):
                value = getattr(method, attr, None)
                if value is not None:
                    parts.append(_describe(value))
            found[name] = "/".join(parts)
        return found

    def hf_methods(model: Any) -> dict[str, str]:
        # compressed-tensors keeps nn.Linear and adds weight_scale; GPTQ/AWQ swap in QuantLinear classes
        return {name: type(mod).__name__ + "".join(f"/{p}" for p in ("qweight", "weight_scale") if hasattr(mod, p))
                for name, mod in model.named_modules() if name.startswith("model.layers.") and name.count(".") == 4}

    return _apply(engine, vllm_methods if hasattr(engine, "llm") else hf_methods)


def layer_io(engine: Any, prompts: list[list[int]], decode_steps: int,
             layers: list[int] | None = None) -> list[dict[str, Any]]:
    """Inputs and outputs of the attention and MoE blocks of `layers` (default every layer) over a prefill and
    greedy decode (layer_probe)."""
    from conformance.engines.layer_probe import layer_io as probe

    return probe(engine, prompts, decode_steps, layers)


def tp_shards(engine: Any) -> list[dict[str, Any]]:
    """Every rank's sharded tensors as its loader placed them (conformance/distributed/tp_shards.py read_shards)."""
    from conformance.engines.shard_probe import read_shards

    return engine.llm.apply_model(read_shards)
