"""Failure diagnosis: match a failed check's captured output against known error signatures.

The signatures are data (`signatures.toml`: pattern → cause, remedy, link, implied failure class), so a new
one is a TOML entry, not code. `diagnose` is used by the dashboard and may be used by the terminal summary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the project depends on tomli there
    import tomli as tomllib  # type: ignore[no-redef]

SIGNATURES_PATH = Path(__file__).with_name("signatures.toml")


class SignatureError(ValueError):
    """The signatures table is malformed; the message names the entry."""


@dataclass(frozen=True)
class Signature:
    """One known error: a regex and what it means."""

    id: str
    pattern: re.Pattern[str]
    cause: str
    remedy: str
    link: str | None = None
    failure_class: str | None = None


@dataclass(frozen=True)
class Diagnosis:
    """A signature found in a message, with the matched text."""

    signature: Signature
    matched: str


def load_signatures(path: Path = SIGNATURES_PATH) -> tuple[Signature, ...]:
    """Read and compile a signatures table; SignatureError names a bad entry."""
    with open(path, "rb") as handle:
        table = tomllib.load(handle)
    out = []
    for index, entry in enumerate(table.get("signature", [])):
        name = entry.get("id", f"#{index}")
        missing = [key for key in ("id", "pattern", "cause", "remedy") if not entry.get(key)]
        if missing:
            raise SignatureError(f"signature {name} in {path.name} lacks {', '.join(missing)}.")
        try:
            pattern = re.compile(entry["pattern"])
        except re.error as exc:
            raise SignatureError(f"signature {name} in {path.name} has a bad pattern: {exc}.") from None
        out.append(Signature(entry["id"], pattern, entry["cause"], entry["remedy"], entry.get("link"),
                             entry.get("class")))
    return tuple(out)


@lru_cache(maxsize=1)
def default_signatures() -> tuple[Signature, ...]:
    return load_signatures()


def diagnose(message: str, signatures: tuple[Signature, ...] | None = None) -> Diagnosis | None:
    """The first signature found in `message`, or None."""
    for signature in default_signatures() if signatures is None else signatures:
        match = signature.pattern.search(message)
        if match:
            return Diagnosis(signature, match.group(0))
    return None
