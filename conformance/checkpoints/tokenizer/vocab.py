"""The o200k vocabulary without a download: `o200k_base.tiktoken` rebuilt byte for byte from the
vocabulary the `quicktok-v1` package ships (or taken from a file the user gives), checked against
its published sha256, and laid out where tiktoken and openai-harmony look for it.

tiktoken caches a blob under `TIKTOKEN_CACHE_DIR/<sha1 of the blob URL>` (tiktoken/load.py,
`read_file_cached`); openai-harmony reads `TIKTOKEN_ENCODINGS_BASE/o200k_base.tiktoken`. Both
check the sha256 themselves, so a wrong rebuild could never pass silently — we check it first
anyway, to fail with one sentence instead of an attempted download.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conformance import datafiles

O200K_FILE = "o200k_base.tiktoken"
O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
# The env var a user sets to an o200k_base.tiktoken file (or a directory holding one) instead of
# relying on quicktok-v1; the plugin's --tokenizer-vocab option is meant to set the same thing.
VOCAB_ENV = "CONFORMANCE_TOKENIZER_VOCAB"


class VocabUnavailable(RuntimeError):
    """No o200k vocabulary can be had on this machine; the message says what to install or pass."""


def facts() -> dict:
    """The numbers of docs/model.md for o200k_harmony, kept as data in conformance/data/tokenizer/."""
    return datafiles.load_toml(datafiles.DATA / "tokenizer" / "o200k_harmony.toml")


def tiktoken_cache_name(url: str = O200K_URL) -> str:
    return hashlib.sha1(url.encode()).hexdigest()


def vocab_env(vocab_dir: Path) -> dict[str, str]:
    """Environment that makes tiktoken, openai-harmony and vLLM's harmony path read vocab_dir."""
    return {"TIKTOKEN_CACHE_DIR": str(vocab_dir), "TIKTOKEN_ENCODINGS_BASE": str(vocab_dir)}


def default_vocab_dir() -> Path:
    return datafiles.cache_root() / "o200k"


def _rebuild_from_quicktok() -> bytes:
    try:
        import quicktok
    except ImportError:
        raise VocabUnavailable(
            f"no o200k vocabulary here: install quicktok-v1 (it comes with the `cpu` extra) or set "
            f"{VOCAB_ENV} to an {O200K_FILE} file.") from None
    enc = quicktok.get_encoding("o200k_base")
    n = int(facts()["mergeable_ranks"])
    # tiktoken's own format (load.py dump_tiktoken_bpe): base64 token, space, rank, newline, by rank
    return b"".join(base64.b64encode(enc.decode_single_token_bytes(i)) + b" %d\n" % i for i in range(n))


def _verified(blob: bytes, origin: str) -> bytes:
    want = facts()["o200k_base_sha256"]
    got = hashlib.sha256(blob).hexdigest()
    if got != want:
        raise VocabUnavailable(f"the o200k vocabulary from {origin} has sha256 {got[:8]}…{got[-4:]}, not "
                               f"{want[:8]}…{want[-4:]}: it is not o200k_base; give the real {O200K_FILE}.")
    return blob


def _user_source(source: Path) -> bytes:
    path = source / O200K_FILE if source.is_dir() else source
    try:
        return path.read_bytes()
    except OSError as exc:
        raise VocabUnavailable(f"cannot read the o200k vocabulary {path} ({exc.strerror}): fix {VOCAB_ENV}.") from None


def _write_atomic(path: Path, blob: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".o200k-", dir=path.parent)
    with os.fdopen(fd, "wb") as fh:
        fh.write(blob)
    os.chmod(tmp, 0o644)  # mkstemp makes it private; a server run as another user must read it too
    os.replace(tmp, path)


def ensure_o200k(cache_dir: Path | None = None, source: Path | None = None) -> Path:
    """Return cache_dir/o200k_base.tiktoken, verified, with tiktoken's sha1-named cache copy beside it.

    source (default: $CONFORMANCE_TOKENIZER_VOCAB) is a user's o200k_base.tiktoken; without one the file
    is rebuilt from quicktok-v1. Raises VocabUnavailable with one sentence when neither can be had."""
    cache_dir = cache_dir or default_vocab_dir()
    if source is None and os.environ.get(VOCAB_ENV):
        source = Path(os.environ[VOCAB_ENV])
    target, alias = cache_dir / O200K_FILE, cache_dir / tiktoken_cache_name()
    want = facts()["o200k_base_sha256"]
    if source is None and target.is_file() and alias.is_file():
        if all(hashlib.sha256(p.read_bytes()).hexdigest() == want for p in (target, alias)):
            return target
    if source is not None:
        blob = _verified(_user_source(source), str(source))
    else:
        blob = _verified(_rebuild_from_quicktok(), "quicktok-v1")
    cache_dir.mkdir(parents=True, exist_ok=True)
    _write_atomic(target, blob)
    _write_atomic(alias, blob)
    return target


def load_ranks(path: Path) -> dict[bytes, int]:
    """Mergeable ranks of a .tiktoken file, parsed the way tiktoken's load_tiktoken_bpe does."""
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@contextmanager
def offline(vocab_dir: Path) -> Iterator[None]:
    """Point tiktoken and openai-harmony at vocab_dir inside this process, restoring the env after."""
    saved = {k: os.environ.get(k) for k in vocab_env(vocab_dir)}
    os.environ.update(vocab_env(vocab_dir))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

