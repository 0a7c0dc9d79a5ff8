"""The signatures' prefilter (env_checks/prefilter.py): it may pass over a text only where the regex finds nothing."""

from __future__ import annotations

import re
from dataclasses import replace

from env_checks import prefilter
from env_checks.signatures import default_signatures, match


def _unfiltered() -> tuple:
    return tuple(replace(s, needs=()) for s in default_signatures())


def test_the_prefilter_changes_no_finding_on_every_example_amid_noise():
    """Each catalogue example, alone and all together amid kernel-log noise: the same matches (ids, lines, counts)
    with the prefilter as with every regex run over the whole text."""
    noise = "[ 1234.567890] amdgpu 0000:1c:00.0: amdgpu: ring gfx_0.0.0 test passed, heartbeat ok\n" * 50
    examples = [e for s in default_signatures() for e in s.examples]
    texts = examples + [noise + "\n".join(examples) + "\n" + noise]
    for text in texts:
        assert match(text) == match(text, _unfiltered()), text[:200]
    assert all(s.needs for s in default_signatures() if s.examples)  # every catalogue entry is prefiltered


def test_needs_are_read_from_the_pattern():
    def needs(pattern: str) -> tuple:
        return prefilter.needs(re.compile(pattern, re.IGNORECASE | re.MULTILINE))

    assert needs(r"Xid \([^)]*\): 48\b") == ("xid (", "): 48")
    assert needs(r"GPU reset begin|VRAM is lost") == ((("gpu reset begin",), ("vram is lost",)),)
    assert needs(r"ring \S+ timeout") == (" timeout", "ring ")  # the longest first
    assert needs(r"(\S+ )?failed to load firmware") == ("failed to load firmware",)  # an optional part needs nothing
    assert needs(r"\d+|abc") == () and needs(r"[a-z]+") == ()  # an alternative that needs nothing: searched always


def test_the_case_folding_matches_the_regex_engine():
    """Outside ASCII, a case-insensitive regex matches U+0130, U+0131 to i, U+017F to s and U+212A to k: the folded
    text keeps them findable."""
    for text in ("\u017figill", "\u0130llegal instruction", "\u0131llegal instruction", "\u212aernel: SIGILL"):
        (sigill,) = [s for s in default_signatures() if s.id == "vllm-cpu-sigill"]
        assert sigill.pattern.search(text), text
        assert prefilter.holds(sigill.needs, prefilter.fold(text)), text
        assert [m.id for m in match(text)] == [m.id for m in match(text, _unfiltered())]
