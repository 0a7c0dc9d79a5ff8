"""Suite-wide settings read from data: the layer probe's sizes, the prompt set (per dtype: limits.py; targets.toml:
conformance/run/run_target.py)."""

from __future__ import annotations

import random
from pathlib import Path

from conformance.datafiles import DATA, load_toml


def release_within(version: str, spec: str) -> bool:
    """Whether an installed version is inside a data file's specifier (such as ">=0.11.1"); a local build such as
    0.26.0+hopper counts as its release, and a version that does not parse is inside none."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(spec).contains(Version(Version(version).public), prereleases=True)
    except InvalidVersion:
        return False


def layer_probe_settings() -> tuple[int, int]:
    """(decode steps, length of the long probe prompt) of the per-layer check."""
    table = load_toml(DATA / "tolerances.toml")["layers"]
    return int(table["decode_steps"]), int(table["long_prompt"])


def layer_probe_prompts(prompts: list[list[int]], vocab_size: int, long_length: int) -> list[list[int]]:
    """The per-layer check's probe prompts: the prompt set and one long prompt of `long_length` tokens (past 1024
    positions where the engine allows), drawn with the check's own seed."""
    rng = random.Random(4096)
    return [*prompts, [rng.randrange(vocab_size - 8) for _ in range(long_length)]]


def layers_probed_at_p0(config: dict) -> list[int] | None:
    """The layers P0's per-layer check probes on this model (tolerances.toml [layers] p0_*): None for every layer,
    else at each depth anchor the nearest layer of each type (sliding, full), in order."""
    table = load_toml(DATA / "tolerances.toml")["layers"]
    count = int(config["num_hidden_layers"])
    if count <= int(table["p0_every_layer_up_to"]):
        return None
    types = config.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(count)]
    chosen: set[int] = set()
    for anchor in table["p0_anchors"]:
        at = float(anchor) * (count - 1)
        for kind in sorted(set(types)):
            chosen.add(min((i for i in range(count) if types[i] == kind), key=lambda i: (abs(i - at), i)))
    return sorted(chosen)


def exact_twin_layers_at_most(config: dict) -> int | None:
    """How many layers the exact float32 twin takes at most on this model (tolerances.toml [exact_twin]): the real
    models' `real_size_layers`, None (every layer that fits) for the tiny model."""
    from conformance.verdicts.profiles import model_key

    if model_key(config) == "tiny":
        return None
    return int(load_toml(DATA / "tolerances.toml")["exact_twin"]["real_size_layers"])


def tiny_prompts(vocab_size: int, path: Path | None = None) -> tuple[list[list[int]], int]:
    """The deterministic token-id prompt set and its max_tokens."""
    spec = load_toml(path or DATA / "prompts" / "tiny.toml")
    rng = random.Random(spec["seed"])
    # the top few ids are eos/pad in the tiny config; keep prompts clear of them
    prompts = [[rng.randrange(vocab_size - 8) for _ in range(n)] for n in spec["lengths"]]
    prompts += [e["motif"] * e["repeat"] for e in spec.get("explicit", [])]
    return prompts, int(spec["max_tokens"])
