"""The ground floor: the suite's data directory, TOML loading with one-sentence errors (`DataError`), the cache
root and the content hash of a checkpoint.

Standard library only, and nothing imported from the package: every wing may import this module, and it imports
none of them (no import runs back up a floor)."""

from __future__ import annotations

import copy
import hashlib
import os
import sys
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


def content_hash(model_dir: Path) -> str:
    """sha256 over config.json and every safetensors file, in name order."""
    digest = hashlib.sha256()
    files = [model_dir / "config.json", *sorted(model_dir.glob("*.safetensors"))]
    for f in files:
        digest.update(f.name.encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()
