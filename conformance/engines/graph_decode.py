"""Graph mode for the transformers engine: prefill eagerly into a static KV cache, then decode by
replaying one captured CUDA/HIP graph of the single-token step (what vLLM does for its decode batch
sizes). As in vLLM, the step's metadata is prepared outside the graph and copied into static
buffers before each replay: the input token, and the additive attention masks of the full and
sliding-window layers (transformers' own mask builder copies from the host, which a capture
forbids). The position comes from the static cache's device-side length counter.

With `capture=False` the same static-cache decode runs each step eagerly instead of replaying: on
any device, it separates a static-cache bug from a graph-capture bug.

`fault` plants a known bug for the negative controls: "stale_input" never refreshes the static input
buffer, so every replay decodes the first generated token again; "frozen_mask" keeps the masks of
the first decode step, so later steps cannot see the keys they wrote."""

from __future__ import annotations

import sys
from typing import Any

from conformance.engines.base import Completion, StepLogprobs

CAPTURE_LOG = "conformance: decode step captured as a CUDA/HIP graph"
FAULTS = ("stale_input", "frozen_mask")


class GraphDecoder:
    def __init__(self, model: Any, device: str, max_len: int, fault: str | None = None, capture: bool = True) -> None:
        import torch
        from transformers.cache_utils import Cache, StaticLayer

        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown graph-mode fault {fault!r}: use one of {FAULTS}")
        if capture and not device.startswith("cuda"):
            raise ValueError(f"graph mode needs a CUDA/HIP device, not {device!r}")
        self.torch, self.model, self.device, self.max_len, self.fault = torch, model, device, max_len, fault
        n_layers = model.config.num_hidden_layers
        # Full-length static layers for every layer: the sliding window is then applied by the mask
        # from the device-side position, never by host-side bookkeeping that a graph would freeze.
        self.cache = Cache(layers=[StaticLayer(max_cache_len=max_len) for _ in range(n_layers)])
        self.token = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.window = int(model.config.sliding_window)
        self.masks = {kind: torch.zeros((1, 1, 1, max_len), dtype=model.dtype, device=device)
                      for kind in ("full_attention", "sliding_attention")}
        self._set_masks(0)
        self.replays = 0
        if capture:
            self.logits = self._capture()
            self._replay = self.graph.replay
        else:
            self._replay = self._eager_step

    def _eager_step(self) -> None:
        with self.torch.no_grad():
            self.logits = self._step()

    def _set_masks(self, position: int) -> None:
        """Masks of a decode step whose query sits at `position` (docs/model.md "Sliding window": the
        window holds the last `sliding_window` positions, the query's own included)."""
        torch = self.torch
        kv = torch.arange(self.max_len)
        seen = kv <= position
        blocked = torch.finfo(self.masks["full_attention"].dtype).min
        for kind, allowed in (("full_attention", seen), ("sliding_attention", seen & (kv > position - self.window))):
            self.masks[kind].copy_(torch.where(allowed, 0.0, blocked).view(1, 1, 1, -1))

    def _step(self) -> Any:
        return self.model(input_ids=self.token, attention_mask=self.masks, past_key_values=self.cache,
                          use_cache=True).logits

    def _capture(self) -> Any:
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(2):  # warm-up allocates the cache and picks kernels outside the capture
                self._step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph):
            logits = self._step()
        torch.cuda.synchronize()
        print(f"{CAPTURE_LOG} (static KV cache of {self.max_len} positions)", file=sys.stderr, flush=True)
        return logits

    def generate(self, prompt: list[int], max_tokens: int, top_k: int, prompt_logprobs: bool) -> Completion:
        torch = self.torch
        if len(prompt) + max_tokens > self.max_len:
            raise ValueError(f"prompt of {len(prompt)} + {max_tokens} tokens exceeds the graph's cache of "
                             f"{self.max_len}")
        self.cache.reset()
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([prompt], device=self.device), past_key_values=self.cache,
                                use_cache=True).logits[0]
        lp = logits.float().log_softmax(-1).cpu()
        prompt_steps = ([StepLogprobs.from_row(lp[t], top_k, prompt[t + 1]) for t in range(len(prompt) - 1)]
                        if prompt_logprobs else [])
        row = lp[-1]
        tokens: list[int] = []
        steps: list[StepLogprobs] = []
        for i in range(max_tokens):
            token = int(row.argmax())
            steps.append(StepLogprobs.from_row(row, top_k, token))
            tokens.append(token)
            if i == max_tokens - 1:
                break
            if not (self.fault == "stale_input" and i > 0):
                self.token.fill_(token)
            if not (self.fault == "frozen_mask" and i > 0):
                self._set_masks(len(prompt) + i)
            self._replay()
            self.replays += 1
            row = self.logits[0, -1].float().log_softmax(-1).cpu()
        return Completion(list(prompt), tokens, steps, prompt_steps)

