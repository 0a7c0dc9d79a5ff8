"""Loads the suite's data files (targets, tolerances, prompt sets) with one-sentence errors."""

from __future__ import annotations

import os
import random
import sys
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from conformance.compare import LogprobTolerance

# Package data (shipped in the wheel), read through importlib.resources: an installed suite never reads
# the checkout. `files()` of an installed (unzipped) package is a pathlib.Path.
DATA: Path = resources.files("conformance") / "data"  # type: ignore[assignment]


def cache_root() -> Path:
    """Where built checkpoints and the offline vocab are cached ($CONFORMANCE_CACHE, else ~/.cache)."""
    env = os.environ.get("CONFORMANCE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "gpu-llm-conformance"


class DataError(ValueError):
    """A data file of the suite or of the user is malformed."""


def load_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{path} does not exist: check the path you gave.") from None
    except tomllib.TOMLDecodeError as exc:
        raise DataError(f"{path} is not valid TOML ({exc}): fix that line and run again.") from None


@cache
def targets() -> dict[str, Any]:
    return load_toml(DATA / "targets.toml")


def tolerance(dtype: str) -> tuple[LogprobTolerance, int]:
    table = load_toml(DATA / "tolerances.toml")["logprobs"]
    if dtype not in table:
        raise DataError(f"tolerances.toml has no [logprobs.{dtype}] table: add limits for {dtype} first.")
    row = table[dtype]
    return LogprobTolerance(row["max_abs"], row.get("p99"), row.get("median")), int(row["top_k"])


def tiny_prompts(vocab_size: int, path: Path | None = None) -> tuple[list[list[int]], int]:
    """The deterministic token-id prompt set and its max_tokens."""
    spec = load_toml(path or DATA / "prompts" / "tiny.toml")
    rng = random.Random(spec["seed"])
    # the top few ids are eos/pad in the tiny config; keep prompts clear of them
    prompts = [[rng.randrange(vocab_size - 8) for _ in range(n)] for n in spec["lengths"]]
    prompts += [e["motif"] * e["repeat"] for e in spec.get("explicit", [])]
    return prompts, int(spec["max_tokens"])
