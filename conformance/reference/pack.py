"""Reference packs: one run's fp64 reference results in one file, so that a fleet computes them once.

A pack is keyed by the model's content hash, the run's prompt set and the reference's version (the digest of its
source and torch's version, reference/cache.py); inside, each result is keyed as in the result cache (checkpoint,
variant, call), so a pack can only ever stand in for the very result a run asks for. `--reference-pack FILE|DIR`:
a run reads the pack where it exists, adds what it computed (or read from its cache), and writes it at its end. In a
directory each model, prompt set and version has its own file. Every pack is opened when the run first needs it, so
the run does not wait for the checkpoint's hash (with a FILE pack, a 16-layer P0 on an H100 took 46 s to its first
check, against 13 s at 2 layers without one; about a minute at 36 layers). An existing FILE that is no
pack, or was made for another prompt set or reference version, is refused in one sentence before anything runs; one
made for another model in the check that first asks; either is left as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from conformance.datafiles import content_hash
from conformance.engines.base import Completion
from conformance.reference import cache

FORMAT = "conformance-reference-pack/1"


class PackRefused(ValueError):
    """A pack that this run cannot use (made for another key, or not a pack)."""


@dataclass(frozen=True)
class PackKey:
    model: str  # sha256 of config.json and the safetensors files (conformance/datafiles.py content_hash)
    prompts: str  # sha256 of the run's prompt set (token ids and max_tokens)
    reference: str  # the reference's version: its source and torch's version (reference/cache.py)

    def file_name(self) -> str:
        return f"reference-{self.model[:16]}-{self.prompts[:12]}-{self.reference[:12]}.json"


def run_key(model_dir: Path, prompts: Any) -> PackKey:
    """The key of a run of the checkpoint in `model_dir` with the prompt set `prompts` (JSON-serialisable)."""
    return PackKey(content_hash(model_dir), _prompts_digest(prompts), cache._source_digest())


def _prompts_digest(prompts: Any) -> str:
    return hashlib.sha256(json.dumps(prompts).encode()).hexdigest()


@dataclass
class Pack:
    path: Path
    key: PackKey
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # result-cache key -> encoded Completion
    read: bool = True  # False: results are computed afresh (--fresh-reference) and only written
    hits: int = 0
    added: int = 0
    parted: list[int] = field(default_factory=list)  # per result missed: the step where its path left the pack's

    def get(self, key: str, call: list[Any]) -> Completion | None:
        if not self.read:
            return None
        if key not in self.results:
            step = self.parting(call[1], call[2])
            if step is not None:
                self.parted.append(step)
            return None
        result = cache.decode(self.results[key])
        if result.prompt_ids != call[1] or result.token_ids != call[2]:
            return None
        self.hits += 1
        return result

    def parting(self, prompt: list[int], tokens: list[int]) -> int | None:
        """The decode step at which `tokens` leave the furthest-reaching path the pack holds for the same prompt;
        None where it holds none, or only this very path (a result missed for another reason). A pack is keyed by
        the engine's tokens, so a second node whose engine parts from the first's computes that result again."""
        steps = [next((n for n, (a, b) in enumerate(zip(theirs, tokens)) if a != b), min(len(theirs), len(tokens)))
                 for r in self.results.values() if r["prompt_ids"] == prompt and (theirs := r["token_ids"]) != tokens]
        return max(steps, default=None)

    def put(self, key: str, result: Completion) -> None:
        if key not in self.results:
            self.results[key] = cache.encode(result)
            self.added += 1

    def write(self) -> None:
        """The pack, atomically, if the run added to it."""
        if not self.added:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".pack-")
        with os.fdopen(fd, "w") as fh:
            json.dump({"format": FORMAT, "key": asdict(self.key), "results": self.results}, fh)
        os.replace(tmp, self.path)


def open_pack(where: Path, key: PackKey, read: bool = True) -> Pack:
    """The pack for `key` at `where` (a pack file, or a directory of packs), empty if there is none yet."""
    path = where / key.file_name() if where.is_dir() else where
    if not path.exists():
        return Pack(path, key, read=read)
    theirs, results = _read(path)
    _refuse_if_made_for_another(path, theirs, asdict(key))
    return Pack(path, key, results, read=read)


def _read(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A pack file's key and results, or the sentence that refuses it."""
    try:
        data = json.loads(path.read_text())
        theirs, results = data["key"], data["results"]
        if data["format"] != FORMAT or not isinstance(results, dict) or not isinstance(theirs, dict):
            raise ValueError(f"format {data['format']!r}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PackRefused(f"--reference-pack {path} is not a reference pack of this suite ({exc}): pass one a run "
                          "wrote, or a directory.") from None
    return theirs, results


def _refuse_if_made_for_another(path: Path, theirs: dict[str, Any], ours: dict[str, str]) -> None:
    differ = [name for name, value in ours.items() if theirs.get(name) != value]
    if differ:
        figures = ", ".join(f"{n} {str(theirs.get(n))[:12]} against {ours[n][:12]}" for n in differ)
        raise PackRefused(f"--reference-pack {path} was made for another {' and '.join(differ)} than this run's "
                          f"({figures}): pass the pack of this model, prompt set and reference version, or a "
                          "directory of packs.")


class LazyPack:
    """The run's pack, opened when the run first touches it (the reference's first result, or the run's end). Its
    key (and a directory's file name) needs the checkpoint's content hash, which the run reads in the
    background from collection on (a minute at gpt-oss-120b's size): opened at the session's start, the pack made
    every run wait for it (12 s at 8 layers on the H200). A pack refused then (damaged, or made for
    another model) is refused in the same sentence, in the check that asked."""

    def __init__(self, opener: Callable[[], Pack]) -> None:
        self._opener, self._pack = opener, None

    def __getattr__(self, name: str) -> Any:  # get, put, path, added, ...: the opened pack's
        if self._pack is None:
            self._pack = self._opener()
        return getattr(self._pack, name)

    # what the run's end asks of it: a pack never touched was never read nor added to, and stays unopened
    @property
    def hits(self) -> int:
        return self._pack.hits if self._pack is not None else 0

    @property
    def parted(self) -> list[int]:
        return self._pack.parted if self._pack is not None else []

    def write(self) -> None:
        if self._pack is not None:
            self._pack.write()


def open_for_run(where: Path, model_dir: Path, prompts: Callable[[int], Any], read: bool) -> LazyPack:
    """Open the run's pack for the checkpoint in `model_dir` and the prompt set `prompts(vocab_size)` gives, and
    hand it to the result cache. An existing FILE that is no pack, or was made for another prompt set or reference
    version, is refused here, before anything runs; the model's part of the key (the checkpoint's content hash, which
    the run reads in the background) is compared when the run first touches the pack, as a directory's pack is
    found then."""
    if not (model_dir / "config.json").is_file():
        raise PackRefused(f"--reference-pack needs the run's checkpoint, and {model_dir} holds no config.json.")
    config = json.loads((model_dir / "config.json").read_text())
    asked = prompts(int(config["vocab_size"]))
    if where.is_file():
        theirs, _ = _read(where)
        _refuse_if_made_for_another(where, theirs, {"prompts": _prompts_digest(asked),
                                                    "reference": cache._source_digest()})
    pack = LazyPack(lambda: open_pack(where, run_key(model_dir, asked), read))
    cache.use_pack(pack)
    return pack
