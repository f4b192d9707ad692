"""The KV zeroer benchmark definition: cleared-bytes model, a CPU run of the harness (reference baseline,
memset peer, Triton a recorded skip), and the Triton impl's factory checked against the reference's bytes
under the interpreter (the path the GPU run takes)."""

from __future__ import annotations

import pytest

from bench.registry import discover
from suites.bench_runs import cpu_verdicts

OPS = ("kv_zero_dsv4_packed", "kv_zero_fa_bf16")


def test_definitions():
    ops = discover()
    dsv4 = {case.label: case for case in ops["kv_zero_dsv4_packed"].sweeps["full"]}
    assert list(dsv4) == ["1MiB", "16MiB", "64MiB", "256MiB", "1GiB"]
    assert dsv4["1GiB"].shape == (7182, 14364)  # 2**30 / (4 x 37,376 B) blocks cleared, half the cache
    assert ops["kv_zero_dsv4_packed"].bytes_model(dsv4["1GiB"]) == 7182 * 4 * 37_376
    fa = {case.label: case for case in ops["kv_zero_fa_bf16"].sweeps["full"]}
    assert ops["kv_zero_fa_bf16"].bytes_model(fa["16MiB"]) == 16 << 20  # 32 blocks x 8 layers x 64 KiB
    for name in OPS:
        assert not ops[name].impl("memset").gated and ops[name].impl("triton").gated
        assert ops[name].headline == (("triton", "memset"), ("triton", "memcpy"))


@pytest.mark.parametrize("name", OPS)
def test_cpu_run(name):
    verdicts = cpu_verdicts(name, "1MiB")
    assert verdicts == {
        "reference-eager": "baseline",
        "memset": "memset peer: scratch all zero",
        "triton": verdicts["triton"],
    }
    assert verdicts["triton"].startswith("skipped: Triton")


@pytest.mark.parametrize("name", OPS)
def test_triton_impl_matches_the_reference_and_the_check_can_fail(name, device):
    op = discover()[name]
    case = op.sweeps["small"][0]
    inputs = op.make_inputs(case, device)
    want = op.impl("reference-eager").factory(inputs)()
    got = op.impl("triton").factory(inputs)()
    assert op.check(got, want) == "exact"
    assert int((want == 0).sum()) == op.bytes_model(case)  # the canary cache had no zero byte before
    got[got.numel() - 1] ^= 1
    assert op.check(got, want) == "mismatch 1/" + str(want.numel())
    scratch = op.impl("memset").factory(inputs)()
    scratch[0] = 1
    assert op.check(scratch, want).startswith("mismatch")
