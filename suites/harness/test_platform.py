"""`kernels.platform` impersonating every target: NVIDIA (Hopper, Blackwell, Ampere), AMD, Intel, CPU."""

from __future__ import annotations

import pytest

import kernels.platform as platform_mod
from kernels.platform import TorchProbe, cuda_family, detect_platform, require_backend, rocm_family


def probe(*, cuda=False, hip=None, xpu=False, name="", capability=(0, 0), gcn="", count=1):
    return TorchProbe(
        hip_version=lambda: hip,
        cuda_version=lambda: None if hip else "13.0",
        cuda_available=lambda: cuda,
        cuda_count=lambda: count,
        cuda_name=lambda: name,
        cuda_capability=lambda: capability,
        gcn_arch=lambda: gcn,
        xpu_available=lambda: xpu,
        xpu_count=lambda: count,
        xpu_name=lambda: name,
        cpu_name=lambda: "Test CPU",
        machine=lambda: "x86_64",
    )


@pytest.mark.parametrize(
    ("name", "capability", "family", "slug"),
    [
        ("NVIDIA H200", (9, 0), "hopper", "h200"),
        ("NVIDIA H100 80GB HBM3", (9, 0), "hopper", "h100-80gb-hbm3"),
        ("NVIDIA B200", (10, 0), "blackwell", "b200"),
        ("NVIDIA GeForce RTX 5090", (12, 0), "blackwell", "geforce-rtx-5090"),
        ("NVIDIA A100-SXM4-80GB", (8, 0), "ampere", "a100-sxm4-80gb"),
        ("NVIDIA L40S", (8, 9), "ada", "l40s"),
    ],
)
def test_cuda_targets(name, capability, family, slug):
    p = detect_platform(probe(cuda=True, name=name, capability=capability, count=2))
    assert (p.backend, p.family, p.slug, p.torch_device, p.device_count) == ("cuda", family, slug, "cuda", 2)
    assert p.arch == f"sm_{capability[0]}{capability[1]}" and p.runtime_version == "13.0"
    assert p.is_cuda() and p.is_gpu() and not p.is_rocm() and p.has_device_capability(capability)
    assert not p.has_device_capability((capability[0] + 1, 0))


@pytest.mark.parametrize(
    ("gcn", "family"),
    [
        ("gfx942:sramecc+:xnack-", "cdna3"),
        ("gfx950", "cdna4"),
        ("gfx90a", "cdna2"),
        ("gfx1100", "rdna3"),
    ],
)
def test_rocm_targets(gcn, family):
    p = detect_platform(probe(cuda=True, hip="6.4.1", name="AMD Instinct MI300X", capability=(9, 4), gcn=gcn))
    assert (p.backend, p.family, p.arch, p.torch_device) == ("rocm", family, gcn.split(":")[0], "cuda")
    assert p.is_rocm() and p.runtime_version == "6.4.1" and p.slug == "instinct-mi300x"


def test_xpu_target():
    p = detect_platform(probe(xpu=True, name="Intel(R) Data Center GPU Max 1550"))
    assert (p.backend, p.family, p.torch_device, p.slug) == ("xpu", "xe", "xpu", "data-center-gpu-max-1550")


def test_cpu_target():
    p = detect_platform(probe())
    assert (p.backend, p.family, p.torch_device, p.device_name, p.arch) == ("cpu", "cpu", "cpu", "Test CPU", "x86_64")
    assert p.is_cpu() and not p.is_gpu() and p.capability is None


def test_two_backends_at_once_is_an_error():
    with pytest.raises(RuntimeError, match="more than one accelerator backend"):
        detect_platform(probe(cuda=True, xpu=True, name="x", capability=(9, 0)))


def test_require_backend_fails_closed():
    cpu = detect_platform(probe())
    with pytest.raises(RuntimeError, match="needs a cuda device but torch sees cpu"):
        require_backend("cuda", cpu)
    assert require_backend("cpu", cpu) is cpu
    with pytest.raises(ValueError, match="expected must be one of"):
        require_backend("tpu", cpu)


def test_current_platform_is_cached_and_resettable(monkeypatch):
    calls = []
    monkeypatch.setattr(platform_mod, "detect_platform", lambda: calls.append(1) or detect_platform(probe()))
    platform_mod.reset_platform()
    try:
        assert platform_mod.current_platform.backend == "cpu"
        assert platform_mod.current_platform.backend == "cpu"
        assert len(calls) == 1
    finally:
        platform_mod.reset_platform()


def test_family_tables():
    assert [cuda_family(c) for c in [(7, 0), (7, 5), (8, 6), (11, 0)]] == ["volta", "turing", "ampere", "blackwell"]
    assert rocm_family("gfx1201") == "rdna4" and rocm_family("gfx803") == "unknown"
