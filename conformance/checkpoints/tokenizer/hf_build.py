"""An HF tokenizer (tokenizer.json, tokenizer_config.json, chat_template.jinja) generated from the
o200k vocabulary, so the tiny gpt-oss can be served with the real o200k_harmony tokenizer.

The BPE merges are recovered from the ranks the way tiktoken encodes: a token of rank r is the
merge of the two parts that byte-pair merging of its bytes reaches using only ranks below r. The
pre-tokenizer is o200k's split regex followed by byte-level mapping, as in gpt-oss's own
tokenizer.json; specials are added tokens. The checks never trust this file: they compare it with
tiktoken and openai-harmony, which do not share its code.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

from conformance.checkpoints.tokenizer import vocab

# Bumped whenever what this module writes changes, so cached tokenizer dirs are regenerated.
BUILDER_VERSION = 1
CHAT_TEMPLATE = resources.files("conformance.checkpoints.tokenizer") / "gpt_oss_chat_template.jinja"  # package data
# o200k_base's split pattern (tiktoken_ext/openai_public.py), kept as the text tokenizers compiles.
O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def special_tokens(facts: dict | None = None) -> dict[int, str]:
    """id -> name of every special token: the named ones of docs/model.md, the rest reserved."""
    facts = facts or vocab.facts()
    named = {int(i): name for name, i in facts["specials"].items()}
    first = int(facts["mergeable_ranks"])
    return {i: named.get(i, f"<|reserved_{i}|>") for i in range(first, int(facts["vocab_size"]))}


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map that byte-level BPE files use."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _merge_parts(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    parts = [bytes([b]) for b in token]
    while True:
        best, best_rank = None, max_rank
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best, best_rank = i, rank
        if best is None:
            return parts
        parts[best:best + 2] = [parts[best] + parts[best + 1]]


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge list, in rank order, that makes BPE reproduce tiktoken's ranks."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) == 1:
            continue
        parts = _merge_parts(ranks, token, rank)
        if len(parts) != 2:
            raise ValueError(f"token {token!r} (rank {rank}) is not the merge of two lower-ranked tokens: "
                             f"the vocabulary is not a BPE vocabulary.")
        merges.append((parts[0], parts[1]))
    return merges


def build_tokenizer(ranks: dict[bytes, int], specials: dict[int, str]):  # -> tokenizers.Tokenizer
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    b2u = byte_to_unicode()

    def text(token: bytes) -> str:
        return "".join(b2u[b] for b in token)

    bpe = models.BPE(vocab={text(t): r for t, r in ranks.items()},
                     merges=[(text(a), text(b)) for a, b in merges_from_ranks(ranks)],
                     ignore_merges=True)  # a whole piece found in the vocab is one token, as in tiktoken
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(specials[i], special=True, normalized=False)
                            for i in sorted(specials)])
    got = {i: tok.id_to_token(i) for i in specials}
    if got != specials:  # add_special_tokens appends; a gap in the ranks would shift every id
        raise ValueError("special tokens did not land on their ids: the vocabulary has gaps")
    return tok


def tokenizer_config(facts: dict) -> dict:
    specials = {int(i): n for n, i in facts["specials"].items()}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": specials[199998],
        "eos_token": specials[int(facts["eos_token_id"])],
        "pad_token": specials[int(facts["pad_token_id"])],
        "model_max_length": 131072,
        # transformers' default would rewrite " ," and " 's" on decode: o200k must round-trip bytes
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "chat_template": CHAT_TEMPLATE.read_text(),
    }


def write_hf_tokenizer(out_dir: Path, vocab_path: Path) -> Path:
    """Write the three tokenizer files for the o200k_base.tiktoken at vocab_path into out_dir."""
    facts = vocab.facts()
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(vocab.load_ranks(vocab_path), special_tokens(facts))
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(facts), indent=2))
    shutil.copyfile(CHAT_TEMPLATE, out_dir / "chat_template.jinja")
    return out_dir


def hf_tokenizer_dir(vocab_path: Path, root: Path | None = None) -> Path:
    """The cached generated tokenizer dir for this vocab and builder version (built atomically)."""
    root = root or vocab.default_vocab_dir().parent
    key = hashlib.sha256(f"{BUILDER_VERSION}:{vocab.facts()['o200k_base_sha256']}".encode()
                         + CHAT_TEMPLATE.read_bytes()).hexdigest()[:16]
    final = root / f"o200k-harmony-hf-{key}"
    if all((final / name).is_file() for name in TOKENIZER_FILES):
        return final
    if final.exists():
        shutil.rmtree(final)  # an interrupted earlier build: regenerate rather than serve half a tokenizer
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".hf-tok-", dir=root))
    write_hf_tokenizer(tmp, vocab_path)
    os.chmod(tmp, 0o755)  # mkdtemp makes it private
    try:
        os.replace(tmp, final)
    except OSError:  # another process won the race; its files are identical
        shutil.rmtree(tmp, ignore_errors=True)
    return final
