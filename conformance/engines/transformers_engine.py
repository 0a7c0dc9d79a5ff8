"""transformers as an engine under test: the path on GPU boxes without vLLM (e.g. a CUDA reference
runner) and a second implementation on the CPU. It has no paged KV cache, so KV checks skip."""

from __future__ import annotations

from typing import Any

from conformance.engines.base import Completion, KVState, StepLogprobs


class TransformersEngine:
    def __init__(self, model: str, options: dict[str, Any]) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.device = options.get("device", "cpu")
        self.dtype = getattr(torch, options.get("dtype", "float32"))
        # tf32 would turn an fp32 verdict into a tf32 one on Ampere and later
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        # Default: every step recomputes the whole sequence (no cache to get wrong). With vLLM's option
        # name, enforce_eager decodes from a static KV cache: True step by step, False by replaying the
        # step captured as a CUDA/HIP graph. The experts then run batched (no data-dependent host sync,
        # which a capture forbids), so the two differ in nothing but the graph.
        modes = {None: "recompute", True: "static", False: "graphs"}
        if options.get("enforce_eager") not in modes:
            raise ValueError(f"enforce_eager must be true, false or absent, not {options['enforce_eager']!r}")
        self.decode = modes[options.get("enforce_eager")]
        self.moe = "eager" if self.decode == "recompute" else "batched_mm"
        self.model = AutoModelForCausalLM.from_pretrained(
            model, dtype=self.dtype, attn_implementation="eager", experts_implementation=self.moe
        ).to(self.device).eval()
        # transformers dequantizes MXFP4 experts to bf16 whatever dtype was asked for; an fp32 or fp16 run would
        # then multiply its activations by bf16 experts ("expected mat1 and mat2 to have the same dtype", fp16 at
        # gpt-oss-120b's dims, run 20261201T132918). Only those parameters are cast: casting the whole model would
        # round buffers such as RoPE's inv_freq too (the RoPE check caught exactly that in fp16, run
        # 20261201T115151).
        if self.dtype != torch.bfloat16:
            for param in self.model.parameters():
                if param.dtype == torch.bfloat16:
                    param.data = param.data.to(self.dtype)
        self._decoder: Any = None

    def info(self) -> dict[str, Any]:
        import transformers

        torch = self.torch
        info: dict[str, Any] = {
            "engine": "transformers",
            "transformers_version": transformers.__version__,
            "platform": self.device.split(":")[0] if not self.device.startswith("cuda") else (
                "rocm" if torch.version.hip else "cuda"),
            "dtype": str(self.dtype).removeprefix("torch."),
            "backends": {"attention": "eager", "moe": self.moe, "decode": self.decode},
        }
        if self.device.startswith("cuda"):
            info["device_name"] = torch.cuda.get_device_name(0)
        return info

    def generate_greedy(
        self, prompts: list[list[int]], max_tokens: int, top_k: int, prompt_logprobs: bool = False
    ) -> list[Completion]:
        if self.decode != "recompute":
            return self._static_greedy(prompts, max_tokens, top_k, prompt_logprobs)
        torch = self.torch
        out = []
        with torch.no_grad():
            for prompt in prompts:
                ids = list(prompt)
                steps, prompt_steps = [], []
                for i in range(max_tokens):
                    logits = self.model(torch.tensor([ids], device=self.device)).logits[0]
                    lp = logits.float().log_softmax(-1).cpu()
                    if i == 0 and prompt_logprobs:
                        prompt_steps = [StepLogprobs.from_row(lp[t], top_k, prompt[t + 1])
                                        for t in range(len(prompt) - 1)]
                    token = int(lp[-1].argmax())
                    steps.append(StepLogprobs.from_row(lp[-1], top_k, token))
                    ids.append(token)
                out.append(Completion(list(prompt), ids[len(prompt):], steps, prompt_steps))
        return out

    def _static_greedy(self, prompts: list[list[int]], max_tokens: int, top_k: int,
                      prompt_logprobs: bool) -> list[Completion]:
        from conformance.engines.graph_decode import GraphDecoder

        max_len = max(len(p) for p in prompts) + max_tokens
        if self._decoder is None or self._decoder.max_len < max_len:
            self._decoder = GraphDecoder(self.model, self.device, max_len, capture=self.decode == "graphs")
        return [self._decoder.generate(p, max_tokens, top_k, prompt_logprobs) for p in prompts]

    def kv_state(self) -> KVState:
        raise NotImplementedError("the transformers engine has no paged KV cache")

    def close(self) -> None:
        del self.model
