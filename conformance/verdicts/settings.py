"""Suite-wide settings read from data: the layer probe's sizes, the prompt set (per dtype: limits.py; targets.toml:
conformance/run/run_target.py)."""

from __future__ import annotations

import random
from pathlib import Path

from conformance.datafiles import DATA, load_toml


def layer_probe_settings() -> tuple[int, int]:
    """(decode steps, length of the long probe prompt) of the per-layer check."""
    table = load_toml(DATA / "tolerances.toml")["layers"]
    return int(table["decode_steps"]), int(table["long_prompt"])


def tiny_prompts(vocab_size: int, path: Path | None = None) -> tuple[list[list[int]], int]:
    """The deterministic token-id prompt set and its max_tokens."""
    spec = load_toml(path or DATA / "prompts" / "tiny.toml")
    rng = random.Random(spec["seed"])
    # the top few ids are eos/pad in the tiny config; keep prompts clear of them
    prompts = [[rng.randrange(vocab_size - 8) for _ in range(n)] for n in spec["lengths"]]
    prompts += [e["motif"] * e["repeat"] for e in spec.get("explicit", [])]
    return prompts, int(spec["max_tokens"])
