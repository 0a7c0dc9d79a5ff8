"""Known error signatures: a regex over a tool's or a log's text → what it means, the remedy, a public link.

The catalogue is data (`signatures.toml` beside this module), so a new signature is a TOML entry, not code.
Patterns are Python regular expressions searched case-insensitively and line-wise (`^`/`$` match at line
ends), written tolerant of the phrasings the tools really print (`HIP error: invalid device function`,
`HIP Error "invalid device function"`, `hipErrorInvalidDeviceFunction`). Each entry carries `examples`: real
messages it must match, checked by the tests.

Stable API (other modules rely on it):
  match(text, source=None) -> list[Match]   every signature found in `text`, in catalogue order
  diagnose(message) -> Diagnosis | None     the first (most specific) signature found, for a failed check
Entries with `source = "kernel"` are kernel-log lines (amdgpu, vfio, NVRM Xid); `match(text, source="kernel")`
looks for those only.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from env_checks import prefilter

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, published as tomli
    import tomli as tomllib

SIGNATURES_PATH = Path(__file__).with_name("signatures.toml")
SEVERITIES = ("fault", "warning", "info")
SOURCES = ("runtime", "kernel", "tool")
FAILURE_CLASSES = (None, "capability_gap", "timeout", "crash", "could_not_run")


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
    title: str = ""
    severity: str = "fault"
    source: str = "runtime"
    examples: tuple[str, ...] = field(default=(), compare=False)
    also: tuple[re.Pattern[str], ...] = ()
    # what the pattern cannot match without (prefilter.needs): looked up in the folded text before any regex runs
    needs: tuple = field(default=(), compare=False)

    def search(self, text: str, folded: str | None = None) -> re.Match[str] | None:
        """The first match of the pattern, provided every `also` pattern occurs somewhere in the text. `folded`
        (prefilter.fold(text)), when given, rules the pattern out at once where a substring it needs is absent."""
        if folded is not None and self.needs and not prefilter.holds(self.needs, folded):
            return None
        found = self.pattern.search(text)
        if found and all(extra.search(text) for extra in self.also):
            return found
        return None


@dataclass(frozen=True)
class Match:
    """A signature found in a text: where (first line, 1-based line number), how often, and what it means."""

    id: str
    severity: str
    title: str
    cause: str
    remedy: str
    link: str | None
    line: str
    lineno: int
    count: int
    matched: str
    source: str
    failure_class: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {key: getattr(self, key) for key in self.__dataclass_fields__}


@dataclass(frozen=True)
class Diagnosis:
    """A signature found in a message, with the matched text (what the reports show for a failed check)."""

    signature: Signature
    matched: str


def _entry(entry: dict, index: int, where: str) -> Signature:
    name = entry.get("id", f"#{index}")
    missing = [key for key in ("id", "pattern", "cause", "remedy") if not entry.get(key)]
    if missing:
        raise SignatureError(f"signature {name} in {where} lacks {', '.join(missing)}.")
    try:
        pattern = re.compile(entry["pattern"], re.IGNORECASE | re.MULTILINE)
        also = tuple(re.compile(extra, re.IGNORECASE | re.MULTILINE) for extra in entry.get("also", []))
    except re.error as exc:
        raise SignatureError(f"signature {name} in {where} has a bad pattern: {exc}.") from None
    severity, source = entry.get("severity", "fault"), entry.get("source", "runtime")
    if severity not in SEVERITIES or source not in SOURCES:
        raise SignatureError(f"signature {name} in {where} has severity {severity!r} / source {source!r}; "
                             f"allowed: {', '.join(SEVERITIES)} / {', '.join(SOURCES)}.")
    examples = entry.get("examples", [])
    if isinstance(examples, str):
        examples = [examples]
    return Signature(entry["id"], pattern, entry["cause"], entry["remedy"], entry.get("link"),
                     entry.get("class"), entry.get("title") or entry["id"].replace("-", " "), severity, source,
                     tuple(examples), also, prefilter.needs(pattern))


def load_signatures(path: Path = SIGNATURES_PATH) -> tuple[Signature, ...]:
    """Read and compile a signatures table; SignatureError names a bad entry."""
    try:
        table = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SignatureError(f"signatures table {Path(path).name} is unreadable: {exc}.") from None
    out = [_entry(entry, index, Path(path).name) for index, entry in enumerate(table.get("signature", []))]
    seen: set[str] = set()
    for signature in out:
        if signature.id in seen:
            raise SignatureError(f"signature {signature.id} in {Path(path).name} is defined twice.")
        seen.add(signature.id)
    return tuple(out)


@lru_cache(maxsize=1)
def default_signatures() -> tuple[Signature, ...]:
    return load_signatures()


def _line_at(text: str, pos: int) -> tuple[str, int]:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return text[start:end if end >= 0 else len(text)].strip(), text.count("\n", 0, pos) + 1


def match(text: str, signatures: tuple[Signature, ...] | None = None, *,
          source: str | None = None) -> list[Match]:
    """Every signature found in `text` (once each, at its first occurrence, with the number of occurrences),
    in catalogue order; `source` keeps only the signatures of that source ("kernel", "runtime", "tool")."""
    found = []
    folded = prefilter.fold(text)  # one pass; then most signatures are ruled out by a substring search or two
    for signature in default_signatures() if signatures is None else signatures:
        if source is not None and signature.source != source:
            continue
        first = signature.search(text, folded)
        if first is None:
            continue
        hits = signature.pattern.finditer(text, first.end())
        line, lineno = _line_at(text, first.start())
        found.append(Match(signature.id, signature.severity, signature.title, signature.cause, signature.remedy,
                           signature.link, line[:500], lineno, 1 + sum(1 for _ in hits), first.group(0)[:200],
                           signature.source, signature.failure_class))
    return found


def diagnose(message: str, signatures: tuple[Signature, ...] | None = None) -> Diagnosis | None:
    """The first signature (in catalogue order: specific causes before their consequences) found, or None."""
    for signature in default_signatures() if signatures is None else signatures:
        found = signature.search(message)
        if found:
            return Diagnosis(signature, found.group(0))
    return None
