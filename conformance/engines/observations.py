"""Records of what an engine's scheduler and KV-cache allocator were seen doing: the paged KV layout,
the blocks one request holds per KV-cache group, a step-by-step run with its queue counts, and the
fate of a submitted request. Plain dataclasses: they cross the pipe from the engine child process."""

from __future__ import annotations

from dataclasses import dataclass, field

from conformance.engines.base import Completion


@dataclass
class KVGroupLayout:
    """One KV-cache group as the engine built it: layers that share one block table."""

    kind: str                     # the spec class, e.g. SlidingWindowSpec / FullAttentionSpec
    layer_names: list[str]
    sliding_window: int | None
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype_bytes: int
    page_size_bytes: int          # bytes of one block of one layer


@dataclass
class KVLayout:
    """The engine's paged KV cache: how many blocks, how big, and which budget they came from."""

    num_blocks: int               # blocks in the shared pool, the null block included
    block_size: int               # tokens per block after the platform resolved it
    requested_block_size: int | None
    budget_bytes: int | None      # memory the allocator was given (None: the engine did not say)
    budget_source: str            # kv_cache_memory_bytes | profiled | unknown
    requested_budget_bytes: int | None
    num_gpu_blocks_override: int | None
    groups: list[KVGroupLayout] = field(default_factory=list)


@dataclass
class RequestBlocks:
    """The KV blocks one live request holds in each group (null placeholders not counted)."""

    request_id: str
    num_computed_tokens: int
    num_tokens: int
    held: list[int]               # per group, in the engine's group order
    free_blocks: int


@dataclass
class StepCounts:
    step: int
    running: int
    waiting: int


@dataclass
class SubmitOutcome:
    """What happened to one submitted request: rejected at once (with what error) or accepted."""

    label: str
    accepted: bool
    seconds: float
    error_type: str = ""
    message: str = ""
    aborted: bool = False         # accepted invalid requests are aborted at once to keep the engine usable


@dataclass
class StepwiseRun:
    """Requests fed to the engine step by step (continuous batching), with what each step held."""

    completions: list[Completion]
    trace: list[StepCounts] = field(default_factory=list)
    first_token_step: list[int] = field(default_factory=list)
    finish_step: list[int] = field(default_factory=list)
    arrivals: list[int] = field(default_factory=list)
    intruders: list[SubmitOutcome] = field(default_factory=list)
    steps: int = 0
    unfinished: int = 0           # requests still in the engine when the run stopped

    @property
    def max_running(self) -> int:
        return max((c.running for c in self.trace), default=0)

    @property
    def max_waiting(self) -> int:
        return max((c.waiting for c in self.trace), default=0)


@dataclass(frozen=True)
class ForwardSpan:
    """The tokens one request had computed in one forward: positions start .. start + tokens - 1."""

    request: int                  # the request's index in the sweep (its groups' requests in order)
    start: int
    tokens: int


@dataclass
class Forward:
    """One forward the scheduler handed the model: how many tokens, and whose."""

    tokens: int
    spans: list[ForwardSpan] = field(default_factory=list)


@dataclass
class ForwardSweep:
    """Groups of requests run one group at a time (no forward holds two groups' requests), every forward recorded:
    the completions in request order, the forwards in order, the group each request belonged to."""

    completions: list[Completion]
    forwards: list[Forward]
    group_of: list[int]
    unfinished: int = 0           # requests still in the engine when the sweep stopped
