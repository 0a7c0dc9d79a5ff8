"""vLLM's offline `LLM` as an engine under test, run inside the engine child process.

Only public entry points are used for generation; the KV-cache state is read from the
scheduler's block pool (in-process engine core), the one place that says which blocks are free.
Internals are reached through `_attr`, which names the missing attribute and the vLLM version, so
a renamed field fails the check that needed it with one clear sentence.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from conformance.engines import running_config
from conformance.engines.base import Completion, KVState, StepLogprobs
from conformance.engines.observations import (
    Forward,
    ForwardSpan,
    ForwardSweep,
    KVGroupLayout,
    KVLayout,
    RequestBlocks,
    StepCounts,
    StepwiseRun,
    SubmitOutcome,
)


def _step(entry: dict | None, chosen: int) -> StepLogprobs:
    top = {int(t): float(lp.logprob) for t, lp in (entry or {}).items()}
    return StepLogprobs(int(chosen), top)


def _completion(prompt: list[int], out: Any, prompt_logprobs: bool) -> Completion:
    gen = out.outputs[0]
    steps = [_step(e, t) for e, t in zip(gen.logprobs or [], gen.token_ids)]
    prompt_steps = []
    if prompt_logprobs:
        prompt_steps = [_step(e, t) for e, t in zip((out.prompt_logprobs or [])[1:], prompt[1:])]
    cached = getattr(out, "num_cached_tokens", None)
    return Completion(list(prompt), list(gen.token_ids), steps, prompt_steps,
                      cached_tokens=None if cached is None else int(cached))


def _validation_errors() -> tuple[type[BaseException], ...]:
    """What vLLM raises for a request it refuses (VLLMValidationError is no ValueError in 0.32; older releases
    raise ValueError)."""
    try:
        from vllm.exceptions import VLLMValidationError
    except ImportError:
        return (ValueError, TypeError)
    return (ValueError, TypeError, VLLMValidationError)


def _attr(obj: Any, *path: str) -> Any:
    """obj.a.b.c, or an AttributeError that says which vLLM internal is missing in this version."""
    for name in path:
        if not hasattr(obj, name):
            import vllm

            raise AttributeError(f"vLLM {vllm.__version__}: {type(obj).__name__} has no attribute {name!r} "
                                 f"(needed: {'.'.join(path)}); the suite's vLLM adapter needs updating")
        obj = getattr(obj, name)
    return obj


class VllmOffline:
    def __init__(self, model: str, options: dict[str, Any]) -> None:
        from vllm import LLM

        self.options = dict(options)
        # the suite feeds token ids, so no tokenizer by default; engine_configs.WITH_TOKENIZER loads it (vLLM then
        # validates prompt ids against the vocabulary, as it does for users)
        self.llm = LLM(model=model, **({"skip_tokenizer_init": True, "disable_log_stats": False} | self.options))
        self._ids = itertools.count()
        self._internal_ids: dict[str, str] = {}  # vLLM appends a random suffix inside the engine core

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

        core = self._core()
        cfg = core.vllm_config
        return {
            "engine": "vllm",
            "vllm_version": vllm.__version__,
            "platform": str(current_platform.device_type),
            "dtype": str(cfg.model_config.dtype).removeprefix("torch."),
            "block_size": cfg.cache_config.block_size,
            "async_scheduling": bool(getattr(cfg.scheduler_config, "async_scheduling", False)),
            "backends": self.llm.apply_model(backends)[0],
            # what it runs, as the run record keeps it (checks/test_running_config.py judges it)
            "running": running_config.read(self.llm, core, running_config.env_prefixes()),
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
        return [_completion(prompt, out, prompt_logprobs) for prompt, out in zip(prompts, outs)]

    def generate_sampled(self, prompts: list[list[int]], params: dict[str, Any] | list[dict[str, Any]],
                         top_k: int = 20) -> list[list[dict]]:
        """Each prompt sampled as `params` say (one dict for all, or one per prompt; SamplingParams fields:
        temperature, top_p, top_k, min_p, seed, n, max_tokens, min_tokens, stop_token_ids, ignore_eos): per prompt,
        per output, its token ids, finish and stop reason, and the raw top-k logprobs at each generated position
        (vLLM's default `raw_logprobs`: the model's own distribution, before temperature and truncation)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        each = params if isinstance(params, list) else [params] * len(prompts)
        sampling = [SamplingParams(**({"detokenize": False, "logprobs": top_k} | p)) for p in each]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sampling, use_tqdm=False)
        return [[{"token_ids": list(o.token_ids), "finish_reason": o.finish_reason, "stop_reason": o.stop_reason,
                  "logprobs": [{int(t): float(lp.logprob) for t, lp in (e or {}).items()} for e in (o.logprobs or [])]}
                 for o in out.outputs] for out in outs]

    def kv_state(self) -> KVState:
        core = self._core()
        pool = core.scheduler.kv_cache_manager.block_pool
        kv_cfg = core.scheduler.kv_cache_config
        groups = {type(g.kv_cache_spec).__name__ + f"[{i}]": len(g.layer_names)
                  for i, g in enumerate(kv_cfg.kv_cache_groups)}
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
        internal = self.llm.llm_engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt),
                                                   self._params(max_tokens, 1, False))
        self._internal_ids[rid] = internal if isinstance(internal, str) else rid
        return rid

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            self.llm.llm_engine.step()

    def abort(self, request_ids: list[str]) -> None:
        self.llm.llm_engine.abort_request(request_ids)

    # Engine conformance probes: the KV layout, per-request blocks, stepwise runs.
    def kv_layout(self) -> KVLayout:
        """The paged KV cache as the engine built it, with the budget it was built from."""
        core = self._core()
        kv_cfg = _attr(core, "scheduler", "kv_cache_config")
        cache_cfg = _attr(core, "vllm_config", "cache_config")
        groups = []
        for g in _attr(kv_cfg, "kv_cache_groups"):
            spec = g.kv_cache_spec
            groups.append(KVGroupLayout(
                kind=type(spec).__name__, layer_names=list(g.layer_names),
                sliding_window=getattr(spec, "sliding_window", None), block_size=int(spec.block_size),
                num_kv_heads=int(_attr(spec, "num_kv_heads")), head_size=int(_attr(spec, "head_size")),
                dtype_bytes=int(_attr(spec, "dtype").itemsize), page_size_bytes=int(spec.page_size_bytes)))
        budget, source = self._kv_budget(cache_cfg)
        requested = self.options.get("block_size")
        return KVLayout(
            num_blocks=int(_attr(kv_cfg, "num_blocks")), block_size=int(cache_cfg.block_size),
            requested_block_size=int(requested) if requested is not None else None,
            budget_bytes=budget, budget_source=source,
            requested_budget_bytes=self.options.get("kv_cache_memory_bytes"),
            num_gpu_blocks_override=getattr(cache_cfg, "num_gpu_blocks_override", None), groups=groups)

    def _kv_budget(self, cache_cfg: Any) -> tuple[int | None, str]:
        explicit = getattr(cache_cfg, "kv_cache_memory_bytes", None)
        if explicit is not None:
            return int(explicit), "kv_cache_memory_bytes"

        def profiled(worker: Any) -> int | None:  # GPU workers keep what their memory profile left for KV
            value = getattr(worker, "available_kv_cache_memory_bytes", None)
            return int(value) if value is not None else None

        try:
            values = [v for v in self.llm.collective_rpc(profiled) if v is not None]
        except Exception:  # noqa: BLE001 - a missing probe is reported as an unknown budget
            values = []
        return (min(values), "profiled") if values else (None, "unknown")

    def scheduler_limits(self) -> dict[str, Any]:
        cfg = _attr(self._core(), "vllm_config")
        sched, cache = cfg.scheduler_config, cfg.cache_config
        graphs = getattr(cfg, "compilation_config", None)
        eager = bool(getattr(cfg.model_config, "enforce_eager", False))
        return {"max_num_seqs": sched.max_num_seqs, "max_num_batched_tokens": sched.max_num_batched_tokens,
                "enable_chunked_prefill": bool(getattr(sched, "enable_chunked_prefill", False)),
                "enable_prefix_caching": bool(getattr(cache, "enable_prefix_caching", False)),
                "max_model_len": cfg.model_config.max_model_len, "block_size": int(cache.block_size),
                # the batch sizes graphs were captured at: none where the engine runs eager
                "cudagraph_capture_sizes": [] if eager or graphs is None
                else sorted(int(s) for s in getattr(graphs, "cudagraph_capture_sizes", None) or ())}

    def forward_sweep(self, groups: list[tuple[list[list[int]], int]], top_k: int,
                      max_steps: int = 20000) -> ForwardSweep:
        """Each group's requests (prompts, tokens to generate; greedy, prompt logprobs, top_k) added at once and
        stepped until they finish, group after group, so that no forward holds two groups' requests; every forward
        the scheduler hands the model is recorded as it scheduled it: its token count and, per request, the first
        position and the number of tokens computed (checks/test_kernel_paths.py). The scheduler's `schedule` is
        wrapped on this instance for the sweep only."""
        from vllm.inputs import TokensPrompt

        engine, sched = self.llm.llm_engine, _attr(self._core(), "scheduler")
        schedule, requests = _attr(sched, "schedule"), _attr(sched, "requests")
        forwards: list[Forward] = []
        owner: dict[str, int] = {}

        def recorded(*args: Any, **kwargs: Any) -> Any:
            start = {rid: int(r.num_computed_tokens) for rid, r in requests.items()}
            out = schedule(*args, **kwargs)
            if out.total_num_scheduled_tokens:
                forwards.append(Forward(int(out.total_num_scheduled_tokens), [
                    ForwardSpan(owner.get(rid, -1), start.get(rid, 0), int(n))
                    for rid, n in out.num_scheduled_tokens.items()]))
            return out

        completions: list[Completion] = []
        group_of: list[int] = []
        left: list[str] = []
        sched.schedule = recorded
        try:
            for g, (prompts, max_tokens) in enumerate(groups):
                ids: dict[str, int] = {}
                for prompt in prompts:
                    rid = f"conformance-{next(self._ids)}"
                    internal = engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt),
                                                  self._params(max_tokens, top_k, True))
                    owner[internal if isinstance(internal, str) else rid] = len(completions) + len(ids)
                    ids[rid] = len(ids)
                done: list[Completion | None] = [None] * len(prompts)
                steps = 0
                while engine.has_unfinished_requests() and steps < max_steps:
                    for out in engine.step():
                        i = ids.get(out.request_id)
                        if i is not None and out.finished:
                            done[i] = _completion(prompts[i], out, True)
                    steps += 1
                left += [rid for rid, i in ids.items() if done[i] is None]
                completions += [c if c is not None else Completion(list(p), []) for c, p in zip(done, prompts)]
                group_of += [g] * len(prompts)
        finally:
            del sched.schedule  # the class's own method again
            if left:
                self.abort(left)  # leave the engine clean for the next check
        return ForwardSweep(completions, forwards, group_of, unfinished=len(left))

    def request_blocks(self, request_id: str) -> RequestBlocks:
        """Blocks a live request holds per KV-cache group, read from the allocator's own tables."""
        core = self._core()
        internal = self._internal_ids.get(request_id, request_id)
        req = _attr(core, "scheduler", "requests").get(internal)
        if req is None:
            raise KeyError(f"request {request_id} is not live in the engine (finished or never added)")
        managers = _attr(core, "scheduler", "kv_cache_manager", "coordinator", "single_type_managers")
        held = [sum(1 for b in _attr(m, "req_to_blocks").get(internal, ()) if not b.is_null)
                for m in managers]
        pool = _attr(core, "scheduler", "kv_cache_manager", "block_pool")
        return RequestBlocks(request_id, int(req.num_computed_tokens), int(req.num_tokens), held,
                             int(pool.get_num_free_blocks()))

    def reset_prefix_cache(self) -> bool:
        return bool(self.llm.reset_prefix_cache())

    def submit(self, label: str, prompt: list[int], max_tokens: int) -> SubmitOutcome:
        """Submit one request; an accepted one is aborted at once (the probe is about admission)."""
        started = time.perf_counter()
        try:
            rid = self.add_request(prompt, max_tokens)
        except _validation_errors() as exc:  # vLLM's input validation: the rejection itself is the observation
            return SubmitOutcome(label, False, time.perf_counter() - started, type(exc).__name__, str(exc))
        # anything else (IndexError, RuntimeError, a dead engine core) is a crash, not a clean rejection: it
        # propagates, and the check fails with it, whatever words its text holds
        seconds = time.perf_counter() - started
        self.abort([rid])
        return SubmitOutcome(label, True, seconds, aborted=True)

    def run_stepwise(self, prompts: list[list[int]], max_tokens: int | list[int], top_k: int = 1,
                     arrivals: list[int] | None = None,
                     intruders: list[tuple[int, str, list[int], int]] | None = None,
                     prompt_logprobs: bool = False, max_steps: int = 20000) -> StepwiseRun:
        """Feed requests at given steps (continuous batching) and step until all finish.

        intruders: (step, label, prompt, max_tokens) submitted while the others are in flight."""
        from vllm.inputs import TokensPrompt

        engine, sched = self.llm.llm_engine, _attr(self._core(), "scheduler")
        n = len(prompts)
        budgets = list(max_tokens) if isinstance(max_tokens, list) else [max_tokens] * n
        arrivals = list(arrivals) if arrivals is not None else [0] * n
        ids = [f"conformance-{next(self._ids)}" for _ in prompts]
        index = {rid: i for i, rid in enumerate(ids)}
        done: list[Completion | None] = [None] * n
        run = StepwiseRun([], first_token_step=[-1] * n, finish_step=[-1] * n, arrivals=arrivals)
        later = list(intruders or [])
        step = 0
        while step < max_steps:
            for i in (i for i in range(n) if arrivals[i] == step):
                engine.add_request(ids[i], TokensPrompt(prompt_token_ids=prompts[i]),
                                   self._params(budgets[i], top_k, prompt_logprobs))
            for item in [x for x in later if x[0] == step]:
                run.intruders.append(self.submit(*item[1:]))
            later = [x for x in later if x[0] > step]
            if not engine.has_unfinished_requests() and all(a <= step for a in arrivals) and not later:
                break
            for out in engine.step():
                i = index.get(out.request_id)
                if i is None:
                    continue
                if run.first_token_step[i] < 0 and out.outputs and out.outputs[0].token_ids:
                    run.first_token_step[i] = step
                if out.finished:
                    done[i], run.finish_step[i] = _completion(prompts[i], out, prompt_logprobs), step
            run.trace.append(StepCounts(step, len(sched.running), len(sched.waiting)))
            step += 1
        run.steps = step
        left = [ids[i] for i in range(n) if done[i] is None]
        run.unfinished = len(left)
        if left:
            self.abort(left)  # leave the engine clean for the next check
        run.completions = [c if c is not None else Completion(list(p), []) for c, p in zip(done, prompts)]
        return run

    def close(self) -> None:
        del self.llm
