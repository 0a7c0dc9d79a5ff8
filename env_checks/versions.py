"""A small PEP 440-ish version parser and range matcher, standard library only.

It reads what the stack reports, which is not always PEP 440: `2.13.0+cpu`, `2.9.0+rocm6.4`,
`0.11.0rc1`, `6.4.1-103` (ROCm's .info/version), `6.8.0-79-generic` (a kernel release), `580.159.04`
(an NVIDIA driver). Ranges are comma-separated clauses such as `>=6.4,<7.3` or `!=0.11.0`; as in PEP 440,
a local label (`+cpu`) does not take part in range comparisons, and a missing component counts as zero
(`6.4` == `6.4.0`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PRE_TAGS = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
_VERSION = re.compile(
    r"""^\s*v?
    (?P<release>\d+(?:\.\d+)*)
    (?:[-_.]?(?P<pre_tag>alpha|beta|preview|pre|rc|a|b|c)[-_.]?(?P<pre_n>\d+)?)?
    (?:[-_.]?(?P<post_tag>post|rev|r)[-_.]?(?P<post_n>\d+)?|-(?P<post_implicit>\d+))?
    (?:[-_.]?(?P<dev_tag>dev)[-_.]?(?P<dev_n>\d+)?)?
    (?:[+\-_.](?P<local>[a-zA-Z0-9][a-zA-Z0-9.+\-_]*))?
    \s*$""",
    re.VERBOSE | re.IGNORECASE,
)
_CLAUSE = re.compile(r"^\s*(==|!=|>=|<=|>|<)\s*(\S+)\s*$")


class InvalidVersion(ValueError):
    """A version string or range clause this parser does not understand."""


@dataclass(frozen=True)
class Version:
    release: tuple[int, ...]
    pre: tuple[int, int] | None = None
    post: int | None = None
    dev: int | None = None
    local: str | None = None

    @classmethod
    def parse(cls, text: str) -> Version:
        match = _VERSION.match(str(text))
        if not match:
            raise InvalidVersion(f"not a version: {text!r}")
        g = match.groupdict()
        if g["post_tag"]:
            post = int(g["post_n"] or 0)
        else:
            post = int(g["post_implicit"]) if g["post_implicit"] else None
        return cls(
            release=tuple(int(part) for part in g["release"].split(".")),
            pre=(_PRE_TAGS[g["pre_tag"].lower()], int(g["pre_n"] or 0)) if g["pre_tag"] else None,
            post=post,
            dev=int(g["dev_n"] or 0) if g["dev_tag"] else None,
            local=g["local"],
        )

    def key(self) -> tuple:
        """Ordering key without the local label; trailing zeros of the release do not count."""
        release = list(self.release)
        while len(release) > 1 and release[-1] == 0:
            release.pop()
        # A dev release sorts before its pre-releases, which sort before the final release.
        if self.pre is None and self.post is None and self.dev is not None:
            pre = (-1, 0)
        else:
            pre = self.pre if self.pre is not None else (3, 0)
        post = -1 if self.post is None else self.post
        dev = float("inf") if self.dev is None else self.dev
        return (tuple(release), pre, post, dev)

    def major_minor(self) -> tuple[int, int]:
        return (self.release[0], self.release[1] if len(self.release) > 1 else 0)


def compare(a: str | Version, b: str | Version) -> int:
    """-1, 0 or 1 as a is older than, equal to, or newer than b (local labels ignored)."""
    ka = (a if isinstance(a, Version) else Version.parse(a)).key()
    kb = (b if isinstance(b, Version) else Version.parse(b)).key()
    return (ka > kb) - (ka < kb)


def in_range(version: str | Version, spec: str) -> bool:
    """True if `version` satisfies every clause of `spec` (e.g. '>=6.4,<7.3'); raises InvalidVersion."""
    clauses = [c for c in spec.split(",") if c.strip()]
    if not clauses:
        raise InvalidVersion(f"empty range: {spec!r}")
    for clause in clauses:
        match = _CLAUSE.match(clause)
        if not match:
            raise InvalidVersion(f"not a range clause: {clause.strip()!r} (use ==, !=, >=, <=, >, <)")
        op, bound = match.groups()
        order = compare(version, bound)
        ok = {"==": order == 0, "!=": order != 0, ">=": order >= 0, "<=": order <= 0,
              ">": order > 0, "<": order < 0}[op]
        if not ok:
            return False
    return True
