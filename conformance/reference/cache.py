"""The reference's teacher-forced results kept on disk, keyed by everything that decides them.

An fp64 reference result is a pure function of the checkpoint's bytes, the token ids it is fed, its options (the
`Math` and depth variants, the fp8 KV format, top-k, the band start), the reference's own source and torch's
version. `conformance run` turns the cache on (`--fresh-reference` leaves it off): a second run of the same model
on the same path (a healthy engine is deterministic) reads the result instead of recomputing it: the 8k-token
long-context reference alone takes several seconds of both cores. An engine whose output changed asks for another
key, so a cached result can never stand in for one the engine did not ask for. A damaged entry is recomputed and
rewritten; the suite's own tests construct references without it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conformance.engines.base import Completion, StepLogprobs

SOURCES = [*sorted(Path(__file__).parent.glob("*.py")), Path(__file__).parents[1] / "engines" / "base.py"]


@dataclasses.dataclass
class Counts:
    hits: int = 0
    misses: int = 0


_root: Path | None = None
counts = Counts()
_model_digests: dict[str, str] = {}


def enable(root: Path) -> None:
    global _root
    _root = root
    counts.hits = counts.misses = 0


def disable() -> None:
    global _root
    _root = None


def enabled() -> bool:
    return _root is not None


@functools.cache
def _source_digest() -> str:
    import torch

    digest = hashlib.sha256(torch.__version__.encode())
    for path in SOURCES:
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def _model_digest(model_dir: Path) -> str:
    """The checkpoint's content hash, computed again whenever one of its files changed size or time."""
    from conformance.checkpoints.models import content_hash

    files = [model_dir / "config.json", *sorted(model_dir.glob("*.safetensors"))]
    key = json.dumps([str(model_dir.resolve()), [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]])
    if key not in _model_digests:
        _model_digests[key] = content_hash(model_dir)
    return _model_digests[key]


def _encode(c: Completion) -> dict:
    steps = lambda rows: [[s.token, [[t, v] for t, v in s.top.items()]] for s in rows]  # noqa: E731
    return {"prompt_ids": c.prompt_ids, "token_ids": c.token_ids, "steps": steps(c.steps),
            "prompt_steps": steps(c.prompt_steps)}


def _decode(d: dict) -> Completion:
    steps = lambda rows: [StepLogprobs(int(tok), {int(t): float(v) for t, v in top}) for tok, top in rows]  # noqa: E731
    return Completion(list(d["prompt_ids"]), list(d["token_ids"]), steps(d["steps"]), steps(d["prompt_steps"]))


def completion(model_dir: Path, variant: dict[str, Any], call: list[Any], compute: Callable[[], Completion]
               ) -> Completion:
    """`compute()` unless the cache is on and holds the result for this model, variant and call."""
    if _root is None:
        return compute()
    key = hashlib.sha256(json.dumps([_source_digest(), _model_digest(model_dir), variant, call],
                                    sort_keys=True, default=repr).encode()).hexdigest()
    path = _root / key[:2] / f"{key}.json"
    try:
        result = _decode(json.loads(path.read_text()))
        if result.prompt_ids == call[1] and result.token_ids == call[2]:
            counts.hits += 1
            return result
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or damaged: computed and written again below
    result = compute()
    counts.misses += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ref-")
    with os.fdopen(fd, "w") as fh:
        json.dump(_encode(result), fh)
    os.replace(tmp, path)
    return result
