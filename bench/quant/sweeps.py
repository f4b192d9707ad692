"""Pieces every quantization benchmark shares: size sweeps by input MiB, the compiled-reference wrapper, the
lazy kernel import, and the eager reference's memory guard."""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable

import torch

from bench.registry import Case, Impl, OpBench, Unavailable

MIB = 1 << 20
FULL_MIB = (1, 16, 64, 256, 1024)
SMALL_MIB = (1, 4, 8)  # eager MXFP4 quantize takes ~0.9 s per call at 8 MiB on the 2-core VM


def label(mib: int) -> str:
    return f"{mib // 1024}GiB" if mib >= 1024 and mib % 1024 == 0 else f"{mib}MiB"


def cases(sizes: tuple[int, ...], k: int, element_size: int = 2) -> list[Case]:
    """One case per input size: [M, k] with M chosen so that the input is `mib` MiB."""
    return [Case(label(mib), float(mib), (mib * MIB // (k * element_size), k)) for mib in sizes]


def sweeps(k: int) -> dict[str, list[Case]]:
    return {"small": cases(SMALL_MIB, k), "full": cases(FULL_MIB, k)}


def bf16_input(case: Case, torch_device: str) -> torch.Tensor:
    """The quantizers' input: seeded randn bf16 of the case's shape (the same tensor on every run)."""
    generator = torch.Generator(device=torch_device).manual_seed(0)
    return torch.randn(case.shape, dtype=torch.bfloat16, device=torch_device, generator=generator)


def packed_fp4_input(
    case: Case, torch_device: str, block_size: int, scale_range: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The dequantizers' input for a [M, K] case: seeded random code bytes [M, K/2] and scale bytes
    [M, K/block_size] drawn from `scale_range` (low inclusive, high exclusive)."""
    m, k = case.shape
    generator = torch.Generator(device=torch_device).manual_seed(0)
    codes = torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, device=torch_device, generator=generator)
    low, high = scale_range
    scales = torch.randint(low, high, (m, k // block_size), dtype=torch.uint8, device=torch_device, generator=generator)
    return codes, scales


@functools.cache
def compiled(fn: Callable) -> Callable:
    # One compile per function per process; dynamic=True makes M (and K) symbolic from the first call.
    # Duck shaping off: at 1 MiB, M = 128 = K/32, so dynamo gave both sizes one symbol and the 4 MiB case
    # recompiled (seen with TORCH_LOGS=recompiles on CPU); without it the whole sweep uses one graph.
    try:
        import torch.fx.experimental._config as fx_config

        fx_config.use_duck_shape = False
    except (ImportError, AttributeError):
        pass
    return torch.compile(fn, dynamic=True)


def kernel(module_name: str, name: str) -> Callable:
    """Import a kernel lazily: a missing module or function makes the impl a recorded skip."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise Unavailable(f"{module_name} is not importable ({type(err).__name__}: {err})") from err
    if not hasattr(module, name):
        raise Unavailable(f"{module_name} has no {name}")
    return getattr(module, name)


def host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def eager_skip(temporaries: float, gpu_max_mib: int) -> Callable[[Case, str], str | None]:
    """Skip the eager reference where its temporaries (`temporaries` x the input) would not fit."""

    def skip_reason(case: Case, backend: str) -> str | None:
        need = temporaries * case.x_value * MIB
        if backend != "cpu" and case.x_value > gpu_max_mib:
            return f"eager reference needs ~{temporaries:g}x the input in temporaries; capped at {gpu_max_mib} MiB"
        if backend == "cpu" and need > host_memory() // 2:
            return f"eager reference needs ~{need / 2**30:.0f} GiB of temporaries, over half the host memory"
        return None

    return skip_reason


def triton_skip(case: Case, backend: str) -> str | None:
    if backend == "cpu":
        return "Triton kernels need a GPU (the CPU interpreter is not a performance target)"
    return None


def quant_op(
    name: str,
    dtype: str,
    sweep: dict[str, list[Case]],
    make_inputs: Callable,
    bytes_model: Callable[[Case], int],
    wrap: Callable,
    reference: Callable,
    kernel_module: str,
    kernel_name: str,
    eager_temporaries: float,
    eager_gpu_max_mib: int,
) -> OpBench:
    """A bandwidth-bound quantization op: the eager reference (the baseline every row is checked against),
    torch.compile of it (a peer, not gated: on the H200, torch 2.11, inductor's build of the MXFP4 dequantize
    reference drops the sign of -0.0 on ~1/16 of outputs, so its mismatches are reported, not failed), and
    the Triton kernel; measured against memcpy. `wrap(get_fn)` turns a function getter into an impl factory."""
    impls = (
        Impl("reference-eager", wrap(lambda: reference), eager_skip(eager_temporaries, eager_gpu_max_mib)),
        Impl("reference-compiled", wrap(lambda: compiled(reference)), gated=False),
        Impl("triton", wrap(lambda: kernel(kernel_module, kernel_name)), triton_skip),
    )
    return OpBench(
        name=name,
        area="quant",
        dtype=dtype,
        x_name="bf16_MiB",
        sweeps=sweep,
        make_inputs=make_inputs,
        impls=impls,
        bytes_model=bytes_model,
        flops_model=lambda case: 0,
        roof="memcpy",
        baselines=("reference-eager", "reference-compiled"),
        compare_to="reference-compiled",
        headline=(("triton", "reference-compiled"), ("triton", "memcpy")),
    )
