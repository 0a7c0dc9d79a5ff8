"""Tokenizer fidelity verdicts: the model's HF tokenizer against the o200k_harmony encoding of
tiktoken (a separate implementation: Rust BPE over the published vocabulary).

Three comparisons, each a report with every problem and the figures: the whole vocabulary (bytes
of every mergeable id), the special tokens (names, ids, vocab size, against docs/model.md "Tokenizer: o200k_harmony"),
and a corpus of hard strings (ids, round trip, and the decode of every id prefix, which is where
byte-level tokenizers meet invalid UTF-8: a prefix that splits a character must decode to U+FFFD
on both sides).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from conformance import datafiles
from conformance.verdicts.verdict import Verdict

CORPUS = datafiles.DATA / "tokenizer" / "corpus.json"


@dataclass(frozen=True)
class CorpusCase:
    name: str
    text: str
    smoke: bool = False
    expect: str = "exact"  # or "replace_or_refuse": text that is not valid Unicode


def load_corpus(smoke_only: bool = False) -> list[CorpusCase]:
    cases = [CorpusCase(c["name"], c["text"], bool(c.get("smoke")), c.get("expect", "exact"))
             for c in json.loads(CORPUS.read_text())["cases"]]
    return [c for c in cases if c.smoke] if smoke_only else cases


@dataclass
class FidelityReport(Verdict):
    what: str
    compared: int = 0
    problems: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.compared > 0

    def figures(self) -> dict[str, float]:
        return {f"{self.what}_compared": float(self.compared), f"{self.what}_problems": float(len(self.problems))}

    def failure_message(self) -> str:
        head = (f"{self.what}: HF tokenizer vs tiktoken o200k_harmony, {self.compared} compared, "
                f"{len(self.problems)} problem(s)")
        if not self.compared:
            head += " — nothing was compared"
        return head + ("\n  " + "\n  ".join(self.problems[:12]) if self.problems else "")


def _first_divergence(got: list[int], want: list[int]) -> int:
    return next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))


def _bytes_of_vocab_string(token: str, u2b: dict[str, int]) -> bytes | None:
    try:
        return bytes(u2b[ch] for ch in token)
    except KeyError:
        return None


def compare_vocabulary(tok: Any, enc: Any, mergeable: int) -> FidelityReport:
    """Every mergeable id names the same bytes in the HF vocab as in tiktoken (byte-level BPE)."""
    from conformance.checkpoints.tokenizer.hf_build import byte_to_unicode

    report = FidelityReport("vocabulary")
    u2b = {ch: b for b, ch in byte_to_unicode().items()}
    names = tok.convert_ids_to_tokens(list(range(mergeable)))
    for i, name in enumerate(names):
        want = enc.decode_single_token_bytes(i)
        got = None if name is None else _bytes_of_vocab_string(name, u2b)
        report.compared += 1
        if got != want:
            report.problems.append(f"id {i}: HF vocab has {name!r} ({got!r}), tiktoken has {want!r}")
    return report


def compare_specials(tok: Any, enc: Any, facts: dict) -> FidelityReport:
    """Vocab size, the named specials of docs/model.md and every reserved id, on both sides."""
    report = FidelityReport("specials")
    size, first = int(facts["vocab_size"]), int(facts["mergeable_ranks"])
    for who, n in (("HF tokenizer", len(tok)), ("tiktoken o200k_harmony", enc.n_vocab)):
        report.compared += 1
        if n != size:
            report.problems.append(f"{who} has {n} tokens, docs/model.md says {size}")
    for name, want in facts["specials"].items():
        report.compared += 1
        ref = enc.encode(name, allowed_special="all")
        got = tok.encode(name, add_special_tokens=False)
        if ref != [want]:
            report.problems.append(f"tiktoken encodes {name} as {ref}, docs/model.md says [{want}]")
        if got != [want]:
            report.problems.append(f"HF tokenizer encodes {name} as {got}, docs/model.md says [{want}]")
    ref_names: dict[int, set[str]] = {}
    for name in enc.special_tokens_set:
        ref_names.setdefault(enc.encode_single_token(name), set()).add(name)
    hf_names = tok.convert_ids_to_tokens(list(range(first, size)))
    for i, name in zip(range(first, size), hf_names):
        report.compared += 1
        # 200018 has two names in tiktoken (<|endofprompt|>, <|reserved_200018|>): either is right
        if name not in ref_names.get(i, set()):
            ref = sorted(ref_names.get(i, [])) or "nothing"
            report.problems.append(f"id {i}: HF names it {name!r}, tiktoken {ref}")
        elif tok.encode(name, add_special_tokens=False) != [i]:
            report.problems.append(f"HF tokenizer does not encode {name} as the single id {i}")
    for role in ("eos", "pad"):
        want = int(facts[f"{role}_token_id"])
        got = getattr(tok, f"{role}_token_id", None)
        report.compared += 1
        if got != want:
            report.problems.append(f"HF {role}_token_id is {got}, docs/model.md says {want}")
    return report


def _replaced(text: str) -> str:
    """What tiktoken encodes for text with lone surrogates (tiktoken/core.py `encode`)."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


REFUSALS = (TypeError, UnicodeError, ValueError)  # how a tokenizer says "not valid text", not how it crashes


def compare_corpus(tok: Any, enc: Any, cases: list[CorpusCase]) -> FidelityReport:
    """Ids, round trip and prefix decodes of every corpus string agree with tiktoken."""
    report = FidelityReport("corpus")
    for case in cases:
        want = enc.encode(case.text, allowed_special="all")
        report.compared += 1
        try:
            got = tok.encode(case.text, add_special_tokens=False)
        except Exception as exc:  # noqa: BLE001 - refusing bad Unicode is allowed, anything else is not
            # a refusal is the input-type error a binding raises for text it cannot take (the Rust tokenizers:
            # TypeError); any other exception is a crash of the tokenizer, whatever the case expects
            if case.expect == "replace_or_refuse" and isinstance(exc, REFUSALS):
                report.refused.append(case.name)
                continue
            report.problems.append(f"{case.name}: HF tokenizer raised {type(exc).__name__}: {exc}")
            continue
        if got != want:
            i = _first_divergence(got, want)
            report.problems.append(
                f"{case.name}: ids differ at position {i} of {len(want)}: HF {got[i:i + 4]} "
                f"({tok.decode(got[i:i + 4])!r}) vs tiktoken {want[i:i + 4]} ({enc.decode(want[i:i + 4])!r})")
            continue
        text = case.text if case.expect == "exact" else _replaced(case.text)
        back = tok.decode(got, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if back != text:
            report.problems.append(f"{case.name}: HF round trip gives {back[:60]!r}, not {text[:60]!r}")
        for k in range(1, len(want)):
            a = tok.decode(want[:k], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            b = enc.decode(want[:k])
            if a != b:
                report.problems.append(f"{case.name}: decode of the first {k} ids: HF {a[-20:]!r} vs "
                                       f"tiktoken {b[-20:]!r}")
                break
    return report
