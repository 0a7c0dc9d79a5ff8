"""The reference's teacher-forced results kept on disk, keyed by everything that decides them.

An fp64 reference result is a pure function of the checkpoint's bytes, the token ids it is fed, its options (the
`Math` and depth variants, the fp8 KV format, top-k, the band start), the reference's own source and torch's
version. `conformance run` turns the cache on (`--fresh-reference` leaves it off): a second run of the same model
on the same path (a healthy engine is deterministic) reads the result instead of recomputing it: the 8k-token
long-context reference alone takes several seconds of both cores. An engine whose output changed asks for another
key, so a cached result can never stand in for one the engine did not ask for. A damaged entry is recomputed and
rewritten; the suite's own tests construct references without it. A reference pack (reference/pack.py), where a run
opened one, is read before the cache and receives every result the run computed or read.

Within a run, a scored path also answers every shorter path of the same prompt that its tokens begin with: the
reference is causal, so its rows up to a step depend on the tokens up to it alone, and a path cut at that step is the
result the shorter call would compute (the sampling check's one-token path, from greedy parity's path through the same
prompt: a whole pass through the model at every depth, twice where the noise twin is asked too).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from conformance.datafiles import content_hash
from conformance.engines.base import Completion, StepLogprobs

SOURCES = [*sorted(Path(__file__).parent.glob("*.py")), Path(__file__).parents[1] / "engines" / "base.py"]


class Pack(Protocol):
    """What the cache asks of a reference pack (reference/pack.py): results by cache key, and writing them out."""

    hits: int  # results read from it
    parted: list[int]  # per result it missed: the decode step where the call's path left the one it holds
    key: Any  # its PackKey: `model` is the content hash of the one checkpoint whose results it holds

    def get(self, key: str, call: list[Any]) -> Completion | None: ...

    def put(self, key: str, result: Completion) -> None: ...

    def write(self) -> Any: ...


@dataclasses.dataclass
class Counts:
    hits: int = 0
    misses: int = 0
    derived: int = 0  # results cut from a longer path of this run through the same prompt (counted in neither)
    compute_s: float = 0.0  # seconds spent computing results, cached or not (the run's `reference` phase)


_root: Path | None = None
_pack: Pack | None = None
# this run's scored paths, by model, variant, prompt and top-k (`_path_key`); None outside a run
_paths: dict[str, list[Completion]] | None = None
counts = Counts()


def enable(root: Path) -> None:
    global _root
    _root = root
    reset_counts()


def reset_counts() -> None:
    """A run's start: nothing computed or read yet (whether or not the cache is on); no path scored yet."""
    global _paths
    counts.hits = counts.misses = counts.derived = 0
    counts.compute_s = 0.0
    _paths = {}


def run_summary() -> dict[str, Any]:
    """What the run's fp64 reference did, for results.json `reference_results`: results computed, results read (from
    the local cache or the pack), of those read from the pack, seconds spent computing, and, where a pack held
    the same prompt along another path of the engine's, the decode step at which each such path parted."""
    parted = sorted(_pack.parted) if _pack is not None else []
    return {"computed": counts.misses, "read": counts.hits, "from_pack": _pack.hits if _pack is not None else 0,
            "derived": counts.derived, "compute_s": round(counts.compute_s, 3)} | (
        {"pack_paths_parted": parted} if parted else {})


def disable() -> None:
    """The run's end: the cache off, the run's reference pack (if it opened one) written and closed."""
    global _root, _pack, _paths
    _root = _paths = None
    if _pack is not None:
        _pack.write()
    _pack = None


def use_pack(pack: Pack) -> None:
    global _pack
    _pack = pack


def pack() -> Pack | None:
    """The reference pack the run opened, if any."""
    return _pack


def enabled() -> bool:
    return _root is not None


@functools.cache
def _source_digest() -> str:
    import torch

    digest = hashlib.sha256(torch.__version__.encode())
    for path in SOURCES:
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def encode(c: Completion) -> dict:
    steps = lambda rows: [[s.token, [[t, v] for t, v in s.top.items()]] for s in rows]  # noqa: E731
    return {"prompt_ids": c.prompt_ids, "token_ids": c.token_ids, "steps": steps(c.steps),
            "prompt_steps": steps(c.prompt_steps)}


def decode(d: dict) -> Completion:
    steps = lambda rows: [StepLogprobs(int(tok), {int(t): float(v) for t, v in top}) for tok, top in rows]  # noqa: E731
    return Completion(list(d["prompt_ids"]), list(d["token_ids"]), steps(d["steps"]), steps(d["prompt_steps"]))


def completion(model_dir: Path, variant: dict[str, Any], call: list[Any], compute: Callable[[], Completion]
               ) -> Completion:
    """`compute()` unless the run's pack or the cache holds the result for this model, variant and call."""
    return completions(model_dir, variant, [call], lambda missing: [compute()])[0]


def completions(model_dir: Path, variant: dict[str, Any], calls: list[list[Any]],
                compute: Callable[[list[list[Any]]], list[Completion]]) -> list[Completion]:
    """The results of `calls`, each read from the run's pack or the cache where it holds it; the others computed
    together by one `compute(missing calls)` (a reference that runs them layer by layer at once), in order."""
    if _root is None and _pack is None and _paths is None:
        counts.misses += len(calls)
        return _timed(lambda: compute(calls))
    model = content_hash(model_dir)
    keys = [hashlib.sha256(json.dumps([_source_digest(), model, variant, call],
                                      sort_keys=True, default=repr).encode()).hexdigest() for call in calls]
    paths = [_path_key(model, variant, call) for call in calls]
    # the run's pack holds its model's results only: another checkpoint's (the exact check's slice) neither reads it,
    # nor counts as a path that parted from its paths, nor goes into it
    pack = _pack if _pack is not None and _pack.key.model == model else None
    results: list[Completion | None] = []
    for key, path, call in zip(keys, paths, calls):
        found = _along(path, call[2]) if path is not None else None  # first: a pack that misses notes a parting
        counts.derived += found is not None
        if found is None and pack is not None:
            found = pack.get(key, call)
            counts.hits += found is not None
        if found is None and _root is not None:
            found = _cached(_root, key, call)
            counts.hits += found is not None
        results.append(found)
    missing = [n for n, r in enumerate(results) if r is None]
    if missing:
        computed = _timed(lambda: compute([calls[n] for n in missing]))
        counts.misses += len(missing)
        for n, result in zip(missing, computed):
            results[n] = result
            if _root is not None:
                _store(_root, keys[n], result)
    for key, path, result in zip(keys, paths, results):
        if pack is not None:
            pack.put(key, result)
        if path is not None and _paths is not None:
            _paths.setdefault(path, []).append(result)
    return results  # type: ignore[return-value]


def _path_key(model: str, variant: dict[str, Any], call: list[Any]) -> str | None:
    """What a scored path shares with the shorter paths it answers: model, variant, prompt and top-k (a `score`
    call is ["score", prompt, tokens, top_k]); None for other calls."""
    if call[0] != "score" or _paths is None:
        return None
    return json.dumps([model, variant, call[1], call[3]], sort_keys=True, default=repr)


def _along(path: str, tokens: list[int]) -> Completion | None:
    """The result for `tokens`, cut from a longer path of this run through the same prompt that begins with them:
    its prompt steps, and its first len(tokens) decode steps (each a row of the tokens before it alone)."""
    for c in (_paths or {}).get(path, ()):
        if len(c.token_ids) > len(tokens) and c.token_ids[:len(tokens)] == tokens:
            return Completion(list(c.prompt_ids), list(tokens), c.steps[:len(tokens)], c.prompt_steps)
    return None


def _timed(compute: Callable[[], Completion]) -> Completion:
    started = time.perf_counter()
    try:
        return compute()
    finally:
        counts.compute_s += time.perf_counter() - started


def _cached(root: Path, key: str, call: list[Any]) -> Completion | None:
    try:
        result = decode(json.loads((root / key[:2] / f"{key}.json").read_text()))
        if result.prompt_ids == call[1] and result.token_ids == call[2]:
            return result
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or damaged: computed and written again
    return None


def _store(root: Path, key: str, result: Completion) -> None:
    path = root / key[:2] / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ref-")
    with os.fdopen(fd, "w") as fh:
        json.dump(encode(result), fh)
    os.replace(tmp, path)
