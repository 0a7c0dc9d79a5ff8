"""The offline o200k_base vocabulary (conformance/checkpoints/tokenizer/vocab.py): rebuilt exactly and found
offline, taken from the environment when a user names a file, refused in one sentence when wrong or missing."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from conformance.checkpoints.tokenizer import vocab


def test_rebuilt_vocab_is_exactly_o200k_base_and_found_offline(o200k_path: Path, enc):
    blob = o200k_path.read_bytes()
    assert hashlib.sha256(blob).hexdigest() == vocab.facts()["o200k_base_sha256"]
    alias = o200k_path.parent / vocab.tiktoken_cache_name()
    assert alias.read_bytes() == blob  # what tiktoken's read_file_cached opens instead of downloading
    assert enc.n_vocab == 201088 and enc.encode("<|call|>", allowed_special="all") == [200012]


def test_user_vocab_file_from_the_env_is_used(o200k_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(vocab.VOCAB_ENV, str(o200k_path.parent))  # a directory holding the file works too
    monkeypatch.setitem(sys.modules, "quicktok", None)  # so it cannot have come from quicktok
    got = vocab.ensure_o200k(tmp_path / "cache")
    assert got.read_bytes() == o200k_path.read_bytes()


def test_wrong_vocab_file_is_refused_in_one_sentence(tmp_path: Path):
    bad = tmp_path / "o200k_base.tiktoken"
    bad.write_bytes(b"YQ== 0\n")
    with pytest.raises(vocab.VocabUnavailable) as err:
        vocab.ensure_o200k(tmp_path / "cache", source=bad)
    msg = str(err.value)
    assert "not o200k_base" in msg and "\n" not in msg


def test_missing_quicktok_names_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "quicktok", None)  # import quicktok now raises ImportError
    monkeypatch.delenv(vocab.VOCAB_ENV, raising=False)
    with pytest.raises(vocab.VocabUnavailable) as err:
        vocab.ensure_o200k(tmp_path / "empty")
    assert "quicktok-v1" in str(err.value) and "\n" not in str(err.value)
