"""What a signature's regex cannot match without: the substrings it needs, read from the pattern itself, so that a
window of a long log that lacks them is passed over by a substring search instead of a regex scan.

A 100 MB kernel log with a RAS fault on its last line took 216 s when every signature's regex (case-insensitive,
tens of alternatives) scanned every 4 MiB window; a substring search is ~2 ms a window. The needs are only ever a
necessary condition: a pattern whose needs cannot be read (no literal of 2 characters in some alternative) has
none and is always searched, so the prefilter can pass over a window only where the regex would find nothing.

  needs(pattern) -> tuple   an AND of: a substring (lower case), or an OR (a tuple) of such ANDs
  fold(text) -> Folded      the text as the needs are looked up in (lower case; see FOLD)
  holds(needs, folded)      whether every need is met
"""

from __future__ import annotations

import re
import sys
from typing import Any

if sys.version_info >= (3, 11):
    from re import _parser as sre_parse
else:  # Python 3.10: the same parser under its old name
    import sre_parse

MIN_KEY = 2  # a single character says too little to be worth a search
# The characters outside ASCII that a case-insensitive regex matches to an ASCII letter, as str.lower() leaves
# them (U+0130 'İ' lowers to 'i' and a combining dot, U+0307, which goes): found by trying every code point.
FOLD = {0x131: "i", 0x17F: "s", 0x307: None}


class Folded(str):
    """A folded text that remembers which substrings it was asked about: signatures share many (`xid (`, `hip`),
    and each lookup is a scan of the whole window."""

    def __new__(cls, text: str) -> Folded:
        low = text.lower()
        made = super().__new__(cls, low if low.isascii() else low.translate(FOLD))
        made.seen = {}
        return made

    def has(self, key: str) -> bool:
        found = self.seen.get(key)
        if found is None:
            found = self.seen[key] = key in self
        return found


def fold(text: str) -> Folded:
    return Folded(text)


def holds(needs: tuple, folded: Folded) -> bool:
    for need in needs:
        if isinstance(need, str):
            if not folded.has(need):
                return False
        elif not any(holds(alternative, folded) for alternative in need):
            return False
    return True


def _branches(parsed: Any) -> list[Any]:
    """The alternatives of a (sub)pattern that is one alternation, possibly in a group; else the pattern alone."""
    items = list(parsed)
    if len(items) == 1 and items[0][0] is sre_parse.BRANCH:
        return list(items[0][1][1])
    if len(items) == 1 and items[0][0] is sre_parse.SUBPATTERN:
        return _branches(items[0][1][-1])
    return [parsed]


def _sequence(parsed: Any) -> tuple:
    """The needs of a sequence: its runs of literal characters, and what its mandatory parts need."""
    out: list[Any] = []
    run = ""

    def close() -> None:
        nonlocal run
        if len(run) >= MIN_KEY and run.isascii():
            out.append(run.lower())
        run = ""

    for op, arg in parsed:
        if op is sre_parse.LITERAL:
            run += chr(arg)
            continue
        close()
        if op is sre_parse.SUBPATTERN:
            out.extend(_alternation(arg[-1]))
        elif op is sre_parse.BRANCH:
            out.extend(_alternation(arg[1], branches=True))
        elif op in (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT) and arg[0] >= 1:
            out.extend(_alternation(arg[2]))
    close()
    # the longest substrings first (the likeliest to be absent, so the rest is never looked up), alternations last
    return tuple(sorted(out, key=lambda need: -len(need) if isinstance(need, str) else 0))


def _alternation(parsed: Any, branches: bool = False) -> tuple:
    alternatives = [_sequence(b) for b in (parsed if branches else _branches(parsed))]
    if len(alternatives) == 1:
        return alternatives[0]
    if any(not a for a in alternatives):  # one alternative needs nothing: the whole needs nothing
        return ()
    return (tuple(alternatives),)


def needs(pattern: re.Pattern[str]) -> tuple:
    """The needs of `pattern` (see the module's docstring); () when none can be read."""
    try:
        return _alternation(sre_parse.parse(pattern.pattern, pattern.flags))
    except Exception:  # noqa: BLE001 - a pattern the parser reads differently is searched as it is
        return ()
