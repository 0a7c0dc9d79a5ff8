"""Failure diagnosis: real error texts (as printed by the tools) map to the right known signature."""

from __future__ import annotations

from pathlib import Path

import pytest

from reports.signatures import SignatureError, default_signatures, diagnose, load_signatures

# (signature id, a message as the tool prints it)
REAL_MESSAGES = [
    ("mxfp4-no-moe-backend",
     "NotImplementedError: No MXFP4 MoE backend supports the deployment configuration."),
    ("hip-no-binary-for-gpu",
     "hipErrorNoBinaryForGpu: Unable to find code object for all current devices!"),
    ("hip-invalid-device-function",
     "RuntimeError: HIP error: invalid device function\nHIP kernel errors might be asynchronously "
     "reported at some other API call, so the stacktrace below might be incorrect."),
    ("cuda-no-kernel-image",
     "RuntimeError: CUDA error: no kernel image is available for execution on the device"),
    ("device-oom",
     "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 12.95 GiB. GPU 0 has a total "
     "capacity of 191.98 GiB of which 18.55 GiB is free."),
    ("device-oom", "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    ("kv-cache-no-memory",
     "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
     "when initializing the engine."),
    ("collective-timeout",
     "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, "
     "NumelIn=8388608, NumelOut=8388608, Timeout(ms)=600000) ran for 600012 milliseconds before timing out."),
    ("collective-error",
     "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
     "ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details)"),
    ("gpu-memory-access-fault",
     "Memory access fault by GPU node-2 (Agent handle: 0x38b6960) on address 0x1000. Reason: Page not "
     "present or supervisor privilege."),
    ("vllm-engine-dead",
     "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace "
     "(above) for the root cause."),
    ("vllm-engine-dead",
     "ERROR [core_client.py:564] Engine core proc EngineCore_DP0 died unexpectedly, shutting down client."),
    ("kfd-permission",
     "ROCk module is loaded\nUnable to open /dev/kfd read-write: Permission denied\nuser is member of "
     "video group"),
    ("hsa-out-of-resources",
     "Call returned HSA_STATUS_ERROR_OUT_OF_RESOURCES: The runtime failed to allocate the necessary "
     "resources."),
    ("no-gpu-visible", "RuntimeError: No HIP GPUs are available"),
    ("cpu-attention-head-dim", "RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2"),
    ("cpu-fp8-kv-cache", "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."),
    ("cpu-wna16-missing", "AttributeError: '_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'"),
    ("vllm-cpu-sigill", "engine process exited with rc 132 (SIGILL)"),
    ("vllm-metadata-missing",
     "importlib.metadata.PackageNotFoundError: No package metadata was found for vllm"),
    ("check-timeout", "Failed: Timeout >300.0s"),
    # A cause beats its consequence: the missing module is named, not just the dead engine after it.
    ("triton-kernels-missing",
     "ModuleNotFoundError: No module named 'triton_kernels'\nRuntimeError: Engine core initialization "
     "failed."),
]


@pytest.mark.parametrize("signature_id, message", REAL_MESSAGES, ids=[sid for sid, _ in REAL_MESSAGES])
def test_real_messages_are_diagnosed(signature_id: str, message: str) -> None:
    found = diagnose(message)
    assert found is not None and found.signature.id == signature_id
    assert found.matched in message


@pytest.mark.parametrize("message", [
    "logprobs_close failed: max |Δlogprob| 0.84 > tolerance 0.35 (bf16) at prompt 3, position 131",
    "assert kv_blocks_free_after_requests == 1023",
    "",
])
def test_ordinary_failures_have_no_diagnosis(message: str) -> None:
    assert diagnose(message) is None


def test_every_signature_is_complete_and_reachable() -> None:
    signatures = default_signatures()
    assert len({s.id for s in signatures}) == len(signatures) >= 15
    covered = {sid for sid, _ in REAL_MESSAGES}
    # Signatures with their own `examples` are checked against them in tests/env_checks/test_diagnose_signatures.py
    assert covered | {s.id for s in signatures if s.examples} == {s.id for s in signatures}
    for signature in signatures:
        assert signature.cause.endswith(".") and signature.remedy.endswith(".")
        assert signature.link is None or signature.link.startswith("https://")
        assert signature.failure_class in (None, "capability_gap", "timeout", "crash", "could_not_run")


def test_a_bad_table_names_the_entry(tmp_path: Path) -> None:
    table = tmp_path / "sig.toml"
    table.write_text('[[signature]]\nid = "broken"\npattern = "(unclosed"\ncause = "c."\nremedy = "r."\n')
    with pytest.raises(SignatureError, match="signature broken .* bad pattern"):
        load_signatures(table)
    table.write_text('[[signature]]\nid = "thin"\npattern = "x"\n')
    with pytest.raises(SignatureError, match="signature thin in sig.toml lacks cause, remedy"):
        load_signatures(table)
