"""vLLM's offline `LLM` as an engine under test, run inside the engine child process.

Only public entry points are used for generation; the KV-cache state is read from the
scheduler's block pool (in-process engine core), the one place that says which blocks are free.
"""

from __future__ import annotations

import itertools
from typing import Any

from conformance.engines.base import Completion, KVState, StepLogprobs


def _step(entry: dict | None, chosen: int) -> StepLogprobs:
    top = {int(t): float(lp.logprob) for t, lp in (entry or {}).items()}
    return StepLogprobs(int(chosen), top)


class VllmOffline:
    def __init__(self, model: str, options: dict[str, Any]) -> None:
        from vllm import LLM

        self.options = dict(options)
        self.llm = LLM(model=model, skip_tokenizer_init=True, disable_log_stats=False, **self.options)
        self._ids = itertools.count()

    def _core(self) -> Any:
        return self.llm.llm_engine.engine_core.engine_core  # needs VLLM_ENABLE_V1_MULTIPROCESSING=0

    def info(self) -> dict[str, Any]:
        import vllm
        from vllm.platforms import current_platform

        def backends(model: Any) -> dict[str, str]:
            found: dict[str, str] = {}
            for name, mod in model.named_modules():
                if hasattr(mod, "impl") and hasattr(mod, "attn_backend"):
                    found[f"attention.{name}"] = type(mod.impl).__name__
                    found[f"sliding_window.{name}"] = str(getattr(mod.impl, "sliding_window", None))
                elif hasattr(mod, "quant_method") and "experts" in name:
                    found[f"moe.{name}"] = type(mod.quant_method).__name__
            return found

        cfg = self._core().vllm_config
        return {
            "engine": "vllm",
            "vllm_version": vllm.__version__,
            "platform": str(current_platform.device_type),
            "dtype": str(cfg.model_config.dtype).removeprefix("torch."),
            "block_size": cfg.cache_config.block_size,
            "backends": self.llm.apply_model(backends)[0],
        }

    def _params(self, max_tokens: int, top_k: int, prompt_logprobs: bool) -> Any:
        from vllm import SamplingParams

        return SamplingParams(
            temperature=0.0, max_tokens=max_tokens, logprobs=top_k, detokenize=False,
            prompt_logprobs=top_k if prompt_logprobs else None, ignore_eos=True,
        )

    def generate_greedy(
        self, prompts: list[list[int]], max_tokens: int, top_k: int, prompt_logprobs: bool = False
    ) -> list[Completion]:
        from vllm.inputs import TokensPrompt

        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts],
            self._params(max_tokens, top_k, prompt_logprobs),
            use_tqdm=False,
        )
        result = []
        for prompt, out in zip(prompts, outs):
            gen = out.outputs[0]
            steps = [_step(e, t) for e, t in zip(gen.logprobs or [], gen.token_ids)]
            prompt_steps = []
            if prompt_logprobs:
                prompt_steps = [_step(e, t) for e, t in zip((out.prompt_logprobs or [])[1:], prompt[1:])]
            result.append(Completion(list(prompt), list(gen.token_ids), steps, prompt_steps))
        return result

    def kv_state(self) -> KVState:
        core = self._core()
        pool = core.scheduler.kv_cache_manager.block_pool
        kv_cfg = core.scheduler.kv_cache_config
        groups = {
            type(g.kv_cache_spec).__name__ + f"[{i}]": len(g.layer_names) for i, g in enumerate(kv_cfg.kv_cache_groups)
        }
        return KVState(
            num_blocks=pool.num_gpu_blocks,
            free_blocks=pool.get_num_free_blocks(),
            block_size=core.vllm_config.cache_config.block_size,
            reserved_blocks=1,  # the null block is never in the free list
            groups=groups,
            running_requests=len(core.scheduler.running) + len(core.scheduler.waiting),
        )

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for m in self.llm.get_metrics():
            value = getattr(m, "value", None)
            if isinstance(value, (int, float)):
                out[m.name] = float(value)
        return out

    # Step-level control: holding a request open or aborting it mid-flight.
    def add_request(self, prompt: list[int], max_tokens: int) -> str:
        from vllm.inputs import TokensPrompt

        rid = f"conformance-{next(self._ids)}"
        self.llm.llm_engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt),
                                        self._params(max_tokens, 1, False))
        return rid

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            self.llm.llm_engine.step()

    def abort(self, request_ids: list[str]) -> None:
        self.llm.llm_engine.abort_request(request_ids)

    def close(self) -> None:
        del self.llm
