"""The RoPE benchmark definitions: sweeps, bytes model, the Triton impl's snapshot on the interpreter, and a CPU
run of the harness (the HF's eager sequence against the mirror; Triton skipped on the CPU)."""

from __future__ import annotations

import torch

from bench.registry import FAMILY_MODULES, discover
from bench.rotary import rope as bench_op
from kernels.tolerances import assert_exact
from reference.rotary.rope import apply_rope
from suites.bench_runs import cpu_verdicts


def test_definitions():
    ops = discover()
    small, large = ops["rope_q9_kv3_d64"], ops["rope_q32_kv8_d128"]
    full = {case.label: case for case in small.sweeps["full"]}
    assert [case.x_value for case in full.values()] == [2**i for i in range(13)]
    # T = 256: q and k (12 heads x 64) read + written in bf16, 8-byte positions, a 64-float table row a token
    assert small.bytes_model(full["T256"]) == 256 * (4 * 12 * 64 + 8 + 4 * 64)
    assert large.bytes_model(large.sweeps["full"][0]) == 4 * 40 * 128 + 8 + 4 * 128
    assert small.roof == "memcpy" and small.cuda_graph and small.baselines == ("reference-eager",)
    assert small.impl("triton").gated and not small.impl("hf-eager").gated
    assert FAMILY_MODULES.index("bench.rotary.rope") < FAMILY_MODULES.index("bench.attention.paged_decode")


def test_triton_impl_returns_a_snapshot_of_its_own_copy(device):
    op = discover()["rope_q9_kv3_d64"]
    inputs = bench_op._inputs(op.sweeps["small"][1], device)
    before = inputs["qkv"].clone()
    call = bench_op._triton(inputs)
    q_out, k_out = call()
    want_q, want_k = apply_rope(
        *bench_op.views(before.cpu(), inputs["heads"]), inputs["positions"].cpu(), inputs["table"].cpu()
    )
    assert_exact(q_out, want_q, "q")
    assert_exact(k_out, want_k, "k")
    assert call() is None
    assert_exact(q_out, want_q, "the snapshot after a timed call")
    assert_exact(inputs["qkv"], before, "the shared inputs")


def test_cpu_run_records_the_runner_peer():
    verdicts = cpu_verdicts("rope_q9_kv3_d64", "T4", ["reference-eager", "hf-eager", "triton"])
    assert verdicts["reference-eager"] == "baseline"
    # HF rounds cos/sin and each op to bf16: an ulp off the fp32 mirror on ~38% of the outputs. Not expected to
    # be bit-equal: the verdict records the measured difference and is not a mismatch (ungated either way)
    assert verdicts["hf-eager"].startswith("differs as expected (HF rounds cos/sin")
    assert "/3072 elements, max_rel " in verdicts["hf-eager"]
    assert verdicts["triton"].startswith("skipped: Triton")


def test_a_wrong_peer_rotation_is_still_a_mismatch():
    """Negative control: the expected-difference check catches a peer that rotates with the wrong sign."""
    base = torch.randn(4, 9, 64, dtype=torch.bfloat16)
    wrong = base.clone()
    wrong[..., :32] = -wrong[..., :32]
    assert bench_op.HF_CHECK((base,), (base,)) == "exact"
    assert bench_op.HF_CHECK((wrong,), (base,)).startswith("mismatch: ")
