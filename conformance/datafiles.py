"""The ground floor: the suite's data directory, TOML loading with one-sentence errors (`DataError`), the cache
root and the content hash of a checkpoint.

Standard library only, and nothing imported from the package: every wing may import this module, and it imports
none of them (no import runs back up a floor)."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
import threading
import time
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Package data (shipped in the wheel), read through importlib.resources: an installed suite never reads
# the checkout. `files()` of an installed (unzipped) package is a pathlib.Path.
DATA: Path = resources.files("conformance") / "data"  # type: ignore[assignment]


class DataError(ValueError):
    """A data file of the suite or of the user is malformed."""


def load_toml(path: Path) -> dict[str, Any]:
    """The parsed file, a fresh copy for each caller (callers may change it); parsed again only once the file
    changed (its size or time)."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        raise DataError(f"{path} does not exist: check the path you gave.") from None
    return copy.deepcopy(_parsed(str(path), stat.st_mtime_ns, stat.st_size))


@lru_cache(maxsize=64)
def _parsed(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    try:
        return tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as exc:
        raise DataError(f"{path} is not valid TOML ({exc}): fix that line and run again.") from None


def cache_root() -> Path:
    """Where built checkpoints and the offline vocab are cached ($CONFORMANCE_CACHE, else ~/.cache)."""
    env = os.environ.get("CONFORMANCE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "gpu-llm-conformance"


HASH_MEMO = "content-hashes.json"  # in cache_root(): digests of checkpoints, by the state of their files
HASH_MEMO_ENTRIES = 64
RACY_NS = 2_000_000_000  # files changed more recently are read every time (as git treats a racy index entry)
_digests: dict[str, str] = {}
_hashing = threading.Lock()  # one at a time: a caller waits for a background hash of the same files


def content_hash(model_dir: Path) -> str:
    """sha256 over config.json and every safetensors file, in name order.

    Every byte is read once per state of the files: the digest is kept, in this process and in the suite cache
    (`content-hashes.json`), under the directory and each file's name, size, inode, modification and change time,
    and computed again when any of them differs. Writing a file changes its change time, which no user can set
    back, so a file rewritten in place is hashed again. At gpt-oss-120b's size (65 GB) a read costs about a minute,
    and a run needs the digest twice (the model's record and the reference's result keys)."""
    with _hashing:
        return _content_hash(model_dir)


def _content_hash(model_dir: Path) -> str:
    files = [model_dir / "config.json", *sorted(model_dir.glob("*.safetensors"))]
    stats = [(f.name, f.stat()) for f in files]
    state = json.dumps([str(model_dir.resolve()),
                        [[n, s.st_size, s.st_ino, s.st_mtime_ns, s.st_ctime_ns] for n, s in stats]])
    key = hashlib.sha256(state.encode()).hexdigest()
    if key in _digests:
        return _digests[key]
    if any(time.time_ns() - s.st_ctime_ns < RACY_NS for _, s in stats):
        return _read_through(files)  # changed just now: a second change within the clock's tick could keep its times
    memo_path = cache_root() / HASH_MEMO
    memo = _read_memo(memo_path)
    if key not in memo:
        digest = _read_through(files)
        memo = {k: v for k, v in _read_memo(memo_path).items() if k != key}
        memo = dict(list(memo.items())[-(HASH_MEMO_ENTRIES - 1):]) | {key: digest}
        _write_memo(memo_path, memo)
    _digests[key] = memo[key]
    return memo[key]


def _read_through(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _read_memo(path: Path) -> dict[str, str]:
    """The kept digests; an absent, unreadable or damaged memo is an empty one (its digests are computed again)."""
    try:
        memo = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(memo, dict):
        return {}
    return {k: v for k, v in memo.items() if isinstance(k, str) and isinstance(v, str) and len(v) == 64}


def _write_memo(path: Path, memo: dict[str, str]) -> None:
    """Written whole and renamed into place; a cache that cannot be written costs the next run a read, no more."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(memo))
        os.replace(tmp, path)
    except OSError:
        pass
