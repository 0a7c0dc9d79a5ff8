"""The device itself as a thing under test, in the engine child process (a GPU fault here fails one
check, not the run): architecture facts, GEMM results for numerics, timed GEMMs and copies."""

from __future__ import annotations

import statistics
from typing import Any

import torch


class DeviceProbe:
    def __init__(self, model: str, options: dict[str, Any]) -> None:
        self.device = torch.device(options.get("device", "cpu"))
        # tf32 would turn an fp32 verdict into a tf32 one: the stack's default is what is tested, but
        # PyTorch's own default is off; a stack that turns it on globally is caught by the numerics check
        self.gpu = self.device.type == "cuda"

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"engine": "device", "device": str(self.device), "torch": torch.__version__,
                                "platform": "cpu"}
        if self.gpu:
            props = torch.cuda.get_device_properties(self.device)
            major, minor = torch.cuda.get_device_capability(self.device)
            # gcnArchName carries the device name on CUDA builds: only HIP reports an ISA there
            arch = props.gcnArchName if torch.version.hip else f"sm_{major}{minor}"
            info |= {"name": props.name, "isa": arch.split(":")[0], "isa_full": arch,
                     "arch_list": torch.cuda.get_arch_list(), "platform": "rocm" if torch.version.hip else "cuda",
                     "memory_gib": props.total_memory / 2**30}
        return info

    def gemm(self, m: int, k: int, n: int, dtype: str, seed: int = 0) -> dict[str, Any]:
        """C = A @ B in dtype on the device; returns the inputs as rounded to dtype and C, on the CPU."""
        gen = torch.Generator().manual_seed(seed)
        a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
        if dtype == "float8":
            fp8 = torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn
            a8, b8 = a.to(fp8).to(self.device), b.to(fp8).to(self.device)
            one = torch.ones((), device=self.device)
            c = torch._scaled_mm(a8, b8.t().contiguous().t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            return {"a": a8.float().cpu(), "b": b8.float().cpu(), "c": c.float().cpu()}
        t = getattr(torch, dtype)
        a_t, b_t = a.to(t).to(self.device), b.to(t).to(self.device)
        c = a_t @ b_t
        return {"a": a_t.float().cpu(), "b": b_t.float().cpu(), "c": c.float().cpu()}

    def _time(self, fn: Any, warmup: int, repeats: int) -> float:
        """Median seconds of fn, timed with device events after warm-up."""
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    def gemm_tflops(self, m: int, k: int, n: int, dtype: str, warmup: int, repeats: int) -> float:
        if dtype == "float8":
            fp8 = torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn
            a = torch.randn(m, k, device=self.device).to(fp8)
            b = torch.randn(n, k, device=self.device).to(fp8).t()
            one = torch.ones((), device=self.device)

            def fn() -> Any:
                return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        else:
            t = getattr(torch, dtype)
            a, b = torch.randn(m, k, device=self.device, dtype=t), torch.randn(k, n, device=self.device, dtype=t)

            def fn() -> Any:
                return a @ b
        return 2 * m * k * n / self._time(fn, warmup, repeats) / 1e12

    def copy_gbps(self, nbytes: int, repeats: int) -> float:
        """Device-to-device copy: bytes read plus bytes written per second."""
        src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=self.device)
        dst = torch.empty_like(src)
        return 2 * nbytes / self._time(lambda: dst.copy_(src), 2, repeats) / 1e9

    def close(self) -> None:
        if self.gpu:
            torch.cuda.empty_cache()
