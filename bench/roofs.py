"""Roofs measured in the same run on the same device, once per bench run, attached to every row; the launch
sweeps measure theirs with the same `measure_memcpy`.

- memcpy: a device-to-device `copy_` of a large uint8 buffer; bytes = read + written (2x the buffer), so
  an op's GB/s under the same bytes model (compulsory read + write) is directly comparable. GPU: 1 GiB,
  20x the H200's 50 MB L2 so the copy streams from HBM (4.24 TB/s on the H200). CPU: 256 MiB, beyond any
  last-level cache (the 2-core VM copies 64 MiB and 256 MiB at the same ~35-43 GB/s).
- gemm: `torch.matmul` of square matrices, flops = 2 n^3. GPU: bf16, n = 8192, large enough for cuBLAS to
  reach its plateau (679 TFLOP/s on the H200). CPU: what the CPU's own matmul does best, fp32 or bf16 (a CPU
  without native bf16 runs bf16 matmul ~100x slower than fp32, which would flatter every op held to it),
  n = 1024 (~2-10 ms on the VM; n = 512 and 2048 give the same rates).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from bench.device import release_memory
from bench.timing import Timing, bench

MEMCPY_BYTES = {"gpu": 1 << 30, "cpu": 256 << 20}
GEMM_N = {"gpu": 8192, "cpu": 1024}
ROOF_UNITS = {"memcpy": "GB/s", "gemm": "TFLOP/s"}


@dataclasses.dataclass(frozen=True)
class Roof:
    name: str  # "memcpy" | "gemm"
    impl: str  # what was timed
    dtype: str
    shape: tuple[int, ...]
    bytes: int
    flops: int
    timing: Timing

    @property
    def unit(self) -> str:
        return ROOF_UNITS[self.name]

    @property
    def value(self) -> float:
        """GB/s for memcpy, TFLOP/s for gemm, at the median time."""
        seconds = self.timing.p50 * 1e-3
        return self.bytes / seconds / 1e9 if self.name == "memcpy" else self.flops / seconds / 1e12


@dataclasses.dataclass(frozen=True)
class Roofs:
    memcpy: Roof
    gemm: Roof

    def __getitem__(self, name: str) -> Roof:
        return {"memcpy": self.memcpy, "gemm": self.gemm}[name]

    def __iter__(self):
        return iter((self.memcpy, self.gemm))


def _time_copy(torch_device: str, nbytes: int, timing: dict[str, float]) -> Timing:
    src = torch.ones(nbytes, dtype=torch.uint8, device=torch_device)
    dst = torch.empty_like(src)
    return bench(lambda: dst.copy_(src), torch_device, **timing)


def _time_matmul(torch_device: str, n: int, dtype: torch.dtype, timing: dict[str, float]) -> Timing:
    generator = torch.Generator(device=torch_device).manual_seed(0)
    a = torch.randn(n, n, dtype=dtype, device=torch_device, generator=generator)
    b = torch.randn(n, n, dtype=dtype, device=torch_device, generator=generator)
    return bench(lambda: torch.matmul(a, b), torch_device, **timing)


def measure_memcpy(torch_device: str, nbytes: int, **timing: float) -> Roof:
    result = _time_copy(torch_device, nbytes, timing)
    release_memory(torch_device)  # the buffers died with _time_copy's frame
    return Roof("memcpy", "torch.Tensor.copy_", "uint8", (nbytes,), 2 * nbytes, 0, result)


GEMM_DTYPES = {"gpu": (torch.bfloat16,), "cpu": (torch.float32, torch.bfloat16)}


def measure_gemm(torch_device: str, n: int, **timing: float) -> Roof:
    """The fastest of `GEMM_DTYPES` for the device kind (one dtype on a GPU)."""
    roofs = []
    for dtype in GEMM_DTYPES["cpu" if torch_device == "cpu" else "gpu"]:
        result = _time_matmul(torch_device, n, dtype, timing)
        release_memory(torch_device)
        size = dtype.itemsize
        roofs.append(
            Roof(
                "gemm", "torch.matmul", str(dtype).removeprefix("torch."), (n, n, n), 3 * n * n * size, 2 * n**3, result
            )
        )
    return max(roofs, key=lambda roof: roof.value)


def measure_roofs(
    torch_device: str,
    *,
    memcpy_bytes: int | None = None,
    gemm_n: int | None = None,
    log: Callable[[str], None] = lambda line: None,
    **timing: float,
) -> Roofs:
    kind = "cpu" if torch_device == "cpu" else "gpu"
    memcpy = measure_memcpy(torch_device, memcpy_bytes or MEMCPY_BYTES[kind], **timing)
    log(f"roof memcpy {memcpy.bytes / 2**20:.0f} MiB moved: {memcpy.value:.1f} GB/s")
    gemm = measure_gemm(torch_device, gemm_n or GEMM_N[kind], **timing)
    log(f"roof gemm {gemm.dtype} {gemm.shape[0]}^3: {gemm.value:.2f} TFLOP/s")
    return Roofs(memcpy, gemm)
