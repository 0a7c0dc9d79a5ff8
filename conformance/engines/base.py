"""The records every engine returns, and the interface an engine adapter implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class StepLogprobs:
    """One decode step: the chosen token and the top-k {token: logprob} (chosen one included)."""

    token: int
    top: dict[int, float]

    @classmethod
    def from_row(cls, row: Any, top_k: int, chosen: int) -> StepLogprobs:
        vals, idx = row.topk(top_k)
        top = {int(i): float(v) for v, i in zip(vals, idx)}
        top.setdefault(int(chosen), float(row[chosen]))
        return cls(int(chosen), top)

    def rank_of(self, token: int) -> int | None:
        ordered = sorted(self.top, key=lambda t: -self.top[t])
        return ordered.index(token) if token in self.top else None

    def cut(self, top_k: int) -> StepLogprobs:
        """This step as `from_row(row, top_k, chosen)` gives it, from a step read with a larger top-k: its top_k
        largest entries, and the chosen token's."""
        top = dict(sorted(self.top.items(), key=lambda kv: -kv[1])[:top_k])
        top.setdefault(self.token, self.top[self.token])
        return StepLogprobs(self.token, top)


@dataclass
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]
    steps: list[StepLogprobs] = field(default_factory=list)
    # prompt_steps[t] predicts prompt token t+1 from the tokens before it (prefill path)
    prompt_steps: list[StepLogprobs] = field(default_factory=list)
    # prompt tokens served from the prefix cache, as the engine reports them for this request (vLLM's
    # RequestOutput.num_cached_tokens); None where the engine does not say
    cached_tokens: int | None = None


@dataclass
class KVState:
    """What the engine's block pool says; `groups` is per KV-cache group (gpt-oss: sliding, full)."""

    num_blocks: int
    free_blocks: int
    block_size: int
    reserved_blocks: int = 1  # vLLM keeps one null block out of the free list
    groups: dict[str, int] = field(default_factory=dict)
    running_requests: int = 0

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_blocks - self.reserved_blocks


class Engine(Protocol):
    """One interface for vLLM offline, vLLM server and transformers."""

    def info(self) -> dict[str, Any]: ...

    def generate_greedy(self, prompts: list[list[int]], max_tokens: int, top_k: int) -> list[Completion]: ...

    def kv_state(self) -> KVState: ...

    def close(self) -> None: ...
