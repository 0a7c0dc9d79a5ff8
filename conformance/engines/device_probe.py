"""The device itself as a thing under test, in the engine child process (a GPU fault here fails one
check, not the run): architecture facts, sampled GEMM results for numerics, timed GEMMs and copies."""

from __future__ import annotations

import contextlib
import functools
import statistics
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])


def frees_device_memory(method: F) -> F:
    """After the call, the probe's tensors go back to the device: the process lives on through the run, and the
    caching allocator would otherwise keep what a GEMM or a copy took (6 GB on the H200) from the vLLM engine and
    the fp64 reference started after it."""
    @functools.wraps(method)
    def wrapper(self: DeviceProbe, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        finally:
            self.close()
    return wrapper  # type: ignore[return-value]


class DeviceProbe:
    def __init__(self, model: str, options: dict[str, Any]) -> None:
        self.device = torch.device(options.get("device", "cpu"))
        # The numerics checks set TF32 on or off per check (and restore it); info records the stack's default.
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
                     "memory_gib": props.total_memory / 2**30, "fp32_matmul": self._fp32_default()}
        return info

    @staticmethod
    def _fp32_default() -> str:
        matmul = torch.backends.cuda.matmul
        try:
            if hasattr(matmul, "fp32_precision"):
                return str(matmul.fp32_precision)
            return "tf32" if matmul.allow_tf32 else "ieee"
        except RuntimeError as exc:  # mixed legacy and new TF32 interfaces
            return f"unreadable: {exc}"[:200]

    @frees_device_memory
    def gemm_sample(self, m: int, k: int, n: int, dtype: str, seed: int, rows: list[int], cols: list[int],
                    tf32: bool = False) -> dict[str, Any]:
        """C = A @ W^T (a linear layer: A is m x k, W is n x k) in `dtype` on the device, computed in full from
        N(0,1) inputs drawn on the device with `seed`; returns, as float32 on the CPU, the sampled rows of A, the
        sampled rows of W (= columns of C), both exactly as rounded to dtype, and the sampled block of C."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        a = torch.randn(m, k, device=self.device, generator=gen)
        w = torch.randn(n, k, device=self.device, generator=gen)
        ri = torch.tensor(rows, dtype=torch.long, device=self.device)
        ci = torch.tensor(cols, dtype=torch.long, device=self.device)
        if dtype.startswith("float8"):
            fp8 = getattr(torch, dtype)
            a_t, w_t = a.to(fp8), w.to(fp8)
            del a, w
            one = torch.ones((), dtype=torch.float32, device=self.device)
            # _scaled_mm wants the first operand row-major and the second column-major: w_t.t() is exactly that
            c = torch._scaled_mm(a_t, w_t.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

            def rows_of(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:  # index_select through a byte view
                return x.view(torch.uint8).index_select(0, idx).view(x.dtype).float()
        else:
            t = getattr(torch, dtype)
            a_t, w_t = a.to(t), w.to(t)
            del a, w
            with self._fp32_matmul(tf32):
                c = torch.nn.functional.linear(a_t, w_t)
                if self.gpu:
                    torch.cuda.synchronize(self.device)

            def rows_of(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
                return x.index_select(0, idx).float()
        return {"a": rows_of(a_t, ri).cpu(), "w": rows_of(w_t, ci).cpu(),
                "c": c.index_select(0, ri).index_select(1, ci).float().cpu()}

    @contextlib.contextmanager
    def _fp32_matmul(self, tf32: bool) -> Iterator[None]:
        """TF32 on or off for fp32 GEMMs for one check, then the stack's own setting back. torch >= 2.9 has a
        per-backend `fp32_precision` and raises when the legacy `allow_tf32` is read after it was used, so the
        newer interface is used where it exists."""
        if not self.gpu:
            yield
            return
        matmul = torch.backends.cuda.matmul
        if hasattr(matmul, "fp32_precision"):
            before = matmul.fp32_precision
            matmul.fp32_precision = "tf32" if tf32 else "ieee"
            try:
                yield
            finally:
                matmul.fp32_precision = before
        else:
            before = matmul.allow_tf32
            matmul.allow_tf32 = tf32
            try:
                yield
            finally:
                matmul.allow_tf32 = before

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

    @frees_device_memory
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

    @frees_device_memory
    def copy_gbps(self, nbytes: int, repeats: int) -> float:
        """Device-to-device copy: bytes read plus bytes written per second."""
        src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=self.device)
        dst = torch.empty_like(src)
        return 2 * nbytes / self._time(lambda: dst.copy_(src), 2, repeats) / 1e9

    def close(self) -> None:
        if self.gpu:
            torch.cuda.empty_cache()
