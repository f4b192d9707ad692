"""The tolerance table: one row per (family, output dtype), each with the measurement behind its numbers.

`LOSSY` rows bound a lossy kernel against its precision-mirroring reference (max and RMS relative error) and
its ideal reference (an SQNR floor). `AGREEMENT` rows bound two evaluation orders of the same reference math.
A row is added with its op, together with the measurement that sets it; the rules that apply the rows are in
`kernels.tolerances.lossy`.
"""

from __future__ import annotations

import dataclasses

import torch

from kernels.tolerances.families import (
    BLOCK_FP8_GEMM,
    BLOCK_FP8_MOE,
    FUSED_MOE,
    LLAMA_KERNELS,
    LLAMA_ORDERS,
    LLAMA_VS_HF,
    MAMBA_CONV1D_UPDATE,
    MAMBA_STATE_UPDATE_OUT,
    MAMBA_STATE_UPDATE_STATE,
    MXFP4_MOE,
    PAGED_DECODE,
    PAGED_PREFILL,
    RMS_NORM,
    RUNNER_LOGPROBS,
    SILU_AND_MUL,
    SSD_ORDERS,
    TINY_HYBRID_ORDERS,
    W4A16_MXFP4_GEMM,
    W4A16_NVFP4_GEMM,
)


@dataclasses.dataclass(frozen=True)
class LossyBound:
    """Bounds of one lossy op family at one output dtype; each number says why it is what it is."""

    max_rel: float  # vs the precision-mirroring reference
    rms_rel: float  # vs the precision-mirroring reference
    sqnr_db: float  # floor vs the ideal reference
    why: str


@dataclasses.dataclass(frozen=True)
class AgreementBound:
    """Two evaluation orders of the same reference math (no kernel, no quantization): max |got - want| <=
    max_rel * max(max|want|, 1). A real bug (a dropped decay, an off-by-one segment, a lost state row) moves
    the result by O(1)."""

    max_rel: float
    why: str


# Key: (op family, output dtype). Rows are added with each lossy op, with the measurement behind them.
_BLOCK_FP8_WHY = (
    "block-FP8 W8A8 GEMM vs reference.gemm.block_fp8 mirror (same FP8 operands, fp32 per-128 block sums). "
    "Interpreter: 0 difference in every suite draw. H200 (2026-11-29): 8192^3 randn, bf16 out, max_rel 3.7e-3 / "
    "rms_rel 6.9e-4 for every launch config; cuBLAS blockwise _scaled_mm vs the same mirror max_rel 3.3e-3. "
    "Before that measurement it was modelled by truncating "
    "each k=32 wgmma step to 13 bits below its largest addend (DeepSeek-V3: ~14 bits kept on H800), "
    "M,N,K up to 64x576x16384, randn data: fp32 out max_rel 1.7e-4 / rms_rel 1.3e-4, bf16 out max_rel 4.4e-3 "
    "(one-ulp rounding flips) / rms_rel 7e-4; vLLM's H100/H200 bound for the same kernel structure is "
    "mean|err|/mean|ref| < 1e-3. Faults: a weight scale read from the next K or N block, on suite data with "
    "block magnitude spreads 2**+-1 and 2**+-4 (1500 CPU draws each), gives rms_rel >= 7.9e-3 (K) and "
    ">= 4.4e-3 (N); with equal block scales such a fault is invisible to any bound. SQNR vs fp64 on the "
    "unquantized operands: median 28.7 dB, min 24.8 dB over 3000 suite-sized draws (spreads up to 2**+-12); "
    "DeepGEMM's FP8 bound calc_diff 1e-3 is ~27 dB at large shapes."
)
_PAGED_DECODE_WHY = (
    "Split-K paged decode (kernels.paged_decode) vs reference.attention.paged.paged_decode_mirror (fp32 scores, "
    "per-split max/sum, p rounded to the cache dtype before p @ v, fp32 combine, one rounding). The kernel's "
    "online softmax rounds p against each tile's running max rather than the split's final max and sums in "
    "another order, so p's roundings land elsewhere and the output can flip an ulp. Interpreter, 400 draws of "
    "the suite's distribution (block 16/32, Hkv 1-2, group 1-8, head 64/128, lengths 1-300, 1-3 sequences, "
    "splits 1/2/3/8, q scaled x1/x4), worst: bf16 max_rel 5.8e-3 / rms_rel 3.1e-3, fp16 9.7e-4 / 3.5e-4; "
    "SQNR vs the fp64 ideal min 51.8 dB (bf16) and 70.5 dB (fp16), the mirror's own the same to 0.1 dB. "
    "Bounds ~2.5x max_rel, 2x rms_rel, SQNR ~7 dB under. Fault block_table_off_by_one: NaN outputs in 98 "
    "of 100 draws, SQNR <= -75 dB in the rest. FP8 caches (e4m3fn codes and per-(slot, KV head) scales from "
    "reference.kv.store; the ideal on the exactly dequantized K/V; rows scaled 2**u, |u| <= 0 or 4, before the "
    "store), same 400-draw distribution: worst bf16 max_rel 6.6e-3 / rms_rel 2.0e-3, fp16 7.0e-4 / 3.4e-4; "
    "SQNR min 48.8 dB (bf16), 68.0 dB (fp16, the mirror's own): V's rounding to q's dtype after dequantizing "
    "costs ~3 dB, inside these rows, so FP8 shares them (K's scale is folded into the score: dequantizing K "
    "to bf16 instead gave 19.4 dB). Fault on FP8 (100 draws): NaN in 97, SQNR 0 / 20.5 dB in 2, one tiny "
    "sequence whose garbage entry j + 1 named the right block. H200 (launch sweep and bench, 282c40b): bf16 "
    "batch 8-256 x context 512-32k worst max_rel 6.7e-3 / rms_rel 2.5e-3, SQNR vs the ideal 52.8 dB; FP8 "
    "3.3e-3 / 2.4e-3, 51.2 dB; the GPU suite at the ci profile passed inside these rows."
)
_PAGED_PREFILL_WHY = (
    "Paged prefill (kernels.paged_prefill) vs reference.attention.paged.paged_prefill_mirror at the kernel's KV "
    "tile (fp32 scores, the same online softmax per tile in exp2, p rounded to the cache dtype before p @ v, "
    "one rounding). Only the fp32 dot sums' order differs, so p can flip an ulp at a rounding boundary. "
    "Interpreter, 400 draws of the suite's distribution (block 16/32/64, Hkv 1-2, group 1-4, head 64/128, "
    "1-3 sequences of 1-40 new tokens after 0-100 cached, q scaled x1/x4): worst bf16 max_rel 2.2e-3 / rms_rel "
    "2.2e-4, fp16 3.6e-4 / 8.0e-5; SQNR vs the fp64 ideal min 52.5 dB (bf16) and 70.9 dB (fp16), the mirror's "
    "own the same. The bounds are the paged_decode row's (~7x max_rel, ~25x rms_rel, SQNR ~7.5 dB under) to "
    "leave room for the GPU's ex2.approx and wgmma sum order. H200 (launch sweep and bench, 282c40b): 8 "
    "sequences x 512-4096 tokens (and 512 after a 1536-token prefix) worst max_rel 3.0e-3 / rms_rel 2.0e-4, "
    "SQNR 53.0 dB; the GPU suite at the ci profile passed inside the row. Fault "
    "block_table_off_by_one (unused entries garbage; two runs of 100 draws): NaN in 79-81, SQNR <= 11 dB in "
    "6-8; 13 within bounds, all tiny one-block sequences in a 2-block cache whose entry j + 1 happens to name "
    "the right block (the suite's negative control uses a case where it cannot)."
)
_MAMBA_STATE_UPDATE_WHY = (
    "Selective state update (kernels.mamba_state_update) vs reference.mamba.state_update's fp32 mirror: same "
    "op order, no FMA (enable_fp_fusion=False), but exp/log are Triton's (numpy float32 on the interpreter, "
    "ex2.approx/lg2.approx on NVIDIA) and the dstate sum is a tree, not torch's order. Interpreter, 3000 random "
    "draws of suites.mamba.state_update_cases (heads 1-4, groups, head_dim 1-16, dstate 1-32, fp32/bf16 state, "
    "fp32/bf16/fp16 x, D/z/dt_bias/softplus on and off, slot tables with pads): worst fp32 max_rel 1.4e-6 / "
    "rms_rel 1.4e-6 (out), 2.4e-6 / 2.4e-6 (state); bf16 out 1.4e-4 / 8.6e-5, bf16 state 1.8e-3 / 4.5e-4; fp16 "
    "out 4.0e-4 / 1.4e-4 (one-ulp flips); SQNR vs the fp64 ideal min 114 dB (fp32 out; the mirror's own 110), "
    "116 dB (fp32 state), 48.9 dB (bf16 out), 50.2 dB (bf16 state), 67.4 dB (fp16 out), each the mirror's own "
    "but fp32 (1500 more draws with dt + dt_bias >= 0 when there is no softplus, the suite's current rule: "
    "within those numbers, fp32 out SQNR min 104 dB, bf16 48.6 dB). The metrics are normalised by the "
    "output's peak, so a problem with one or two outputs that "
    "nearly cancel (state * dA + dB x, or the C sum) is ill-conditioned: hypothesis' ci profile found head_dim "
    "1 x 1 head x one live request with fp32 max_rel = rms_rel 1.4e-5, SQNR 91 dB. Bounds: fp32 1e-4 / 1e-4 / "
    "80 dB (7x and 11 dB beyond that case, which also leaves room for the GPU's ex2.approx, ~1.5e-6 relative "
    "on dA at |dt A| <= 20; not yet measured on the H200); a bf16 (fp16) rounding flip is one ulp, <= 2**-7 "
    "(2**-10) of the value: max_rel 2**-7 (2**-10), rms_rel a quarter (half) of that, SQNR ~9-12 dB under the "
    "worst seen (ill-conditioned draws lower the mirror's own SQNR as well). Fault slot_is_row (request i "
    "updates slot i): untouched slots change (exact check) and the updated ones are off by O(1)."
)
_MAMBA_CONV1D_WHY = (
    "Causal conv1d update (kernels.mamba_conv1d_update) with SiLU vs reference.mamba.conv1d's mirror: the taps "
    "sum in the same order without FMA (bit-exact without activation), only exp differs. Interpreter, 300 "
    "draws of suites/mamba/test_conv1d_update.py's distribution (SiLU forced): worst fp32 max_rel 1.3e-7 / "
    "rms_rel 1.3e-7, bf16 and fp16 0 / 0; SQNR vs the fp64 ideal min 137 dB (fp32), 50.2 dB (bf16), 69.5 dB "
    "(fp16), each the mirror's own to 0.1 dB. GPU "
    "modelled as for the state update (ex2.approx, |acc| <= ~20: <= ~1.5e-6 relative on the sigmoid)."
)
_RMS_NORM_WHY = (
    "RMSNorm / fused add + RMSNorm (kernels.rms_norm) vs reference.norm.rms_norm's mirror (the runner's op order: "
    "fp32 mean of squares, rsqrt, round to the dtype, weight multiply, round). The kernel sums the squares in a "
    "tree and its rsqrt is approximate (rsqrt.approx on sm_90, ~2 ulp fp32), so the normalized value can flip "
    "one ulp before the weight multiply: <= 2 ulps of the output (2**-6 bf16, 2**-9 fp16). Interpreter, 1440 "
    "draws (hidden 64/100/576/1024, 3 rows, x*4 + randn residual, randn weight): bf16 0 / 0, fp16 max_rel "
    "2.9e-4 / rms_rel 3.5e-5 (9 tensors with a flip), fp32 2.8e-7 / 1.3e-7; SQNR vs the fp64 ideal min 47.4 "
    "dB (bf16), 66.7 dB (fp16), 139 dB (fp32), each the mirror's own rounding. GPU not yet measured: the "
    "bounds are the 2-ulp model, rms_rel a quarter of it; fp32 max_rel allows 40 fp32 ulps for rsqrt.approx "
    "and the sum order. Faults (eps dropped, residual added after the norm) give NaN rows or max_rel > 0.3."
)
_SILU_AND_MUL_WHY = (
    "SiLU-and-mul (kernels.silu_and_mul) vs reference.activation.silu_and_mul's mirror (fp32 g / (1 + exp(-g)) * "
    "up, one rounding). The kernel's exp is Triton's (numpy float32 on the interpreter, ex2.approx on NVIDIA) "
    "and so is its division, so a value can flip one ulp: 2**-8 relative in bf16, 2**-11 in fp16. Interpreter, "
    "300 draws (I 33-1152, 1-3 rows, x * 0.25-16, bf16 / fp16 / fp32): bf16 and fp16 0 / 0, fp32 max_rel 1.4e-7 "
    "/ rms_rel 6.2e-8; SQNR vs the fp64 ideal min 52.9 dB (bf16), 71.8 dB (fp16), 143.6 dB (fp32), each the "
    "mirror's own; inputs scaled by 2**-8 make fp16 outputs subnormal (products near 2**-17), where the "
    "mirror's own SQNR falls to 51.7 dB (hypothesis), and to 34.6 dB for one output at 1.4e-6: where every fp16 "
    "output is subnormal the suite's floor is the mirror's own SQNR less 6 dB (suites/activation/"
    "test_silu_and_mul.py). Bounds: two ulps max (2**-7, 2**-10), rms a quarter, SQNR "
    "6 dB under the mirror's worst; fp32 40 ulps for ex2.approx. H200 (bench silu_and_mul_i14336, 1-4096 "
    "rows of 14336): max_rel 0, bit-equal to the mirror. The FP8 form is held bit for bit to the "
    "reference quantizer over the unfused output (no row). Fault gate_up_swapped: max_rel ~1."
)
_FUSED_MOE_WHY = (
    "fused_moe (kernels.fused_moe) vs reference.moe.experts.fused_moe_mirror: the same roundings (fp32 GEMM sums, "
    "the activation in fp32 rounded once, each (token, slot) product rounded once, the combine in fp32), the sums "
    "in another order. Interpreter: bit-identical over nearly every suite draw. A reassociation can flip one ulp of "
    "an intermediate, which the second GEMM carries into every output of its token: one hypothesis draw (5 "
    "tokens, H 17, I 9, top 3, fp16, swiglu_oai) has 7 of token 0's 17 outputs one ulp off, rms_rel 4.7e-4 over "
    "its 85 outputs; at one token every output can be. Bounds: max_rel 4 output ulps, rms_rel one ulp. H200 "
    "(bench/moe inputs, Mixtral and Qwen3-30B-A3B shapes, 1-4,096 tokens): max_rel 0.0034-0.0068, rms_rel <= "
    "0.0011. SQNR vs the fp64 ideal is the mirror's own rounding: 50.2-51.4 dB bf16, 68-70 dB fp16 "
    "over suites/moe's draws; the planted faults give 2.7 dB (gate/up swapped), -3.7 dB (the next expert's "
    "weights) and -4.2 dB (blocks labelled with the next expert), interpreter, 33 tokens, 8 experts, top 2."
)
_BLOCK_FP8_MOE_WHY = (
    "block_fp8_moe (kernels.block_fp8_moe) vs reference.moe.quantized.block_fp8_moe_mirror: the same FP8 codes "
    "of x (kernels.fp8_quant is the reference quantizer bit for bit), the GEMMs as block_fp8_gemm's contract. "
    "Interpreter: bit-identical (suites/moe draws and seeds 0-2 of H 256, I 128, 8 experts, top 2). On the GPU "
    "the FP8 dot's in-block accumulation keeps fewer bits than fp32 (the block_fp8_gemm row), and an "
    "intermediate one bf16 ulp off can move its FP8 code, which the second GEMM carries. H200 (bench/moe inputs, "
    "DeepSeek-V3 expert shapes): max_rel 0.0015-0.0106, rms_rel 1e-4-0.0051 at 16-256 tokens, max_rel 0.0099 at "
    "4,096; the bounds ~1.5x the worst. SQNR vs the fp64 ideal (no intermediate quantization): "
    "the mirror's own 32.5-33.1 dB; the planted faults give 15.7-17.1 dB (the next K block's weight scale, "
    "rms_rel 0.14-0.17), 1.7-2.4 dB (gate/up swapped), -1.9 to -2.9 dB (the next expert's weights)."
)
_MXFP4_MOE_WHY = (
    "mxfp4_moe (kernels.mxfp4_moe) vs reference.moe.quantized.mxfp4_moe_mirror: weights decoded exactly to bf16 in "
    "both, then the bf16 layer's roundings; the kernel sums even and odd K columns in two dots, another order. "
    "Interpreter, seeds 0-2 of H 256, I 128, 8 experts, top 2: bit-identical on two, max_rel 0.0025 and rms_rel "
    "1.4e-4 on the third (a reassociation flip carried by the second GEMM): the fused_moe row's bounds. H200 "
    "(gpt-oss-20b shape, reports/cuda-h200/mxfp4_moe_*): max_rel 0.0019-0.0060 over 1-4,096 tokens, rms_rel "
    "1.1e-4-1.2e-4 at 16 and 256 tokens. SQNR vs the fp64 ideal of the decoded weights: 50.7-50.8 dB, the "
    "mirror's own; the planted faults give 1.8-2.3 dB (gate/up swapped) and -1.8 to -2.9 dB "
    "(the next expert's weights)."
)
LOSSY: dict[tuple[str, torch.dtype], LossyBound] = {
    (MXFP4_MOE, torch.bfloat16): LossyBound(2.0**-5, 2.0**-7, 40.0, _MXFP4_MOE_WHY),
    (BLOCK_FP8_MOE, torch.bfloat16): LossyBound(0.06, 8e-3, 28.0, _BLOCK_FP8_MOE_WHY),
    (FUSED_MOE, torch.bfloat16): LossyBound(2.0**-5, 2.0**-7, 40.0, _FUSED_MOE_WHY),
    (FUSED_MOE, torch.float16): LossyBound(2.0**-8, 2.0**-10, 55.0, _FUSED_MOE_WHY),
    # max_rel: one bf16 ulp of the peak (2**-7) plus 2.2e-3 for the accumulator; rms_rel: 3x the model.
    (BLOCK_FP8_GEMM, torch.bfloat16): LossyBound(1e-2, 2e-3, 22.0, _BLOCK_FP8_WHY),
    # max_rel: one fp16 ulp of the peak (2**-10) plus 2e-3; rms_rel: 8x the model.
    (BLOCK_FP8_GEMM, torch.float16): LossyBound(3e-3, 1e-3, 22.0, _BLOCK_FP8_WHY),
    # no output rounding: ~10x the modelled accumulator error.
    (BLOCK_FP8_GEMM, torch.float32): LossyBound(2e-3, 1e-3, 22.0, _BLOCK_FP8_WHY),
    (PAGED_DECODE, torch.bfloat16): LossyBound(1.5e-2, 6e-3, 45.0, _PAGED_DECODE_WHY),
    (PAGED_DECODE, torch.float16): LossyBound(2.5e-3, 1e-3, 62.0, _PAGED_DECODE_WHY),
    (PAGED_PREFILL, torch.bfloat16): LossyBound(1.5e-2, 6e-3, 45.0, _PAGED_PREFILL_WHY),
    (PAGED_PREFILL, torch.float16): LossyBound(2.5e-3, 1e-3, 62.0, _PAGED_PREFILL_WHY),
    (MAMBA_STATE_UPDATE_OUT, torch.float32): LossyBound(1e-4, 1e-4, 80.0, _MAMBA_STATE_UPDATE_WHY),
    (MAMBA_STATE_UPDATE_OUT, torch.bfloat16): LossyBound(2.0**-7, 2.0**-9, 40.0, _MAMBA_STATE_UPDATE_WHY),
    (MAMBA_STATE_UPDATE_OUT, torch.float16): LossyBound(2.0**-10, 2.0**-11, 55.0, _MAMBA_STATE_UPDATE_WHY),
    (MAMBA_STATE_UPDATE_STATE, torch.float32): LossyBound(1e-4, 1e-4, 80.0, _MAMBA_STATE_UPDATE_WHY),
    (MAMBA_STATE_UPDATE_STATE, torch.bfloat16): LossyBound(2.0**-7, 2.0**-9, 40.0, _MAMBA_STATE_UPDATE_WHY),
    (MAMBA_CONV1D_UPDATE, torch.float32): LossyBound(5e-6, 3e-6, 110.0, _MAMBA_CONV1D_WHY),
    (MAMBA_CONV1D_UPDATE, torch.bfloat16): LossyBound(2.0**-7, 2.0**-9, 45.0, _MAMBA_CONV1D_WHY),
    (MAMBA_CONV1D_UPDATE, torch.float16): LossyBound(2.0**-10, 2.0**-12, 60.0, _MAMBA_CONV1D_WHY),
    (RMS_NORM, torch.bfloat16): LossyBound(2.0**-6, 2.0**-8, 40.0, _RMS_NORM_WHY),
    (RMS_NORM, torch.float16): LossyBound(2.0**-9, 2.0**-11, 60.0, _RMS_NORM_WHY),
    (RMS_NORM, torch.float32): LossyBound(5e-6, 1e-6, 120.0, _RMS_NORM_WHY),
    (SILU_AND_MUL, torch.bfloat16): LossyBound(2.0**-7, 2.0**-9, 46.0, _SILU_AND_MUL_WHY),
    (SILU_AND_MUL, torch.float16): LossyBound(2.0**-10, 2.0**-12, 45.0, _SILU_AND_MUL_WHY),
    (SILU_AND_MUL, torch.float32): LossyBound(5e-6, 1e-6, 120.0, _SILU_AND_MUL_WHY),
    (W4A16_MXFP4_GEMM, torch.bfloat16): LossyBound(
        max_rel=2.0**-7,
        rms_rel=2.0**-8,
        sqnr_db=6.0,
        why="Kernel and mirror sum the same exact fp32 products in different orders and round once to bf16, "
        "so an output can differ by one bf16 ulp (<= 2**-7 of itself) where reassociation crosses a rounding "
        "boundary: max_rel 2**-7; flips are rare, rms_rel 2**-8 leaves room (interpreter: 0 and 0 over 40 "
        "draws, bit-identical). SQNR vs the unquantized fp64 product is MXFP4's own loss: median 18.5 dB, "
        "min 8.5 dB over 3000 suite-shaped draws (M 1-8, N 16-40, K 32-224, block spread up to 2**+-4, four "
        "scale modes; small outputs make it noisy), 16.4-19.3 dB at 8 x 256 x 1024; weight-scrambling bugs "
        "give <= 0 dB.",
    ),
    (W4A16_NVFP4_GEMM, torch.bfloat16): LossyBound(
        max_rel=2.0**-7,
        rms_rel=2.0**-8,
        sqnr_db=8.0,
        why="Kernel and mirror sum the same exact fp32 products (bf16 x times E2M1 * E4M3, exact in bf16) in "
        "different orders, multiply by the global scale (the kernel: each split-K partial) and round once to "
        "bf16, so an output can differ by one bf16 ulp where reassociation crosses a rounding boundary: max_rel "
        "2**-7, rms_rel 2**-8 (interpreter: bit-identical on every suite draw). SQNR vs the unquantized fp64 "
        "product is NVFP4's own loss: median 20.5 dB, min 10.3 dB over 3000 suite-shaped draws (M 1-33, N "
        "16-40, K 16-224, blocks of 16 spread up to 2**+-4, both global-scale conventions, a global scale of "
        "the tensor's amax or 4x it), 20.5 dB at 8 x 256 x 1024; the planted bugs give <= 2.8 dB (10 draws).",
    ),
}


AGREEMENT: dict[tuple[str, torch.dtype], AgreementBound] = {
    (SSD_ORDERS, torch.float64): AgreementBound(
        1e-12,
        (
            "SSD chunked scan vs the sequential recurrence, a scan split and resumed, a one-token scan vs the "
            "decode update (reference.mamba): over 3000 draws of the suite's distribution the worst difference is "
            "1.2e-15 of max(|want|, 1); 1e-12 leaves room for longer sums."
        ),
    ),
    (SSD_ORDERS, torch.float32): AgreementBound(
        1e-5,
        (
            "The fp32 decode reference and the fp32 scan on one token round differently (einsum sums vs the "
            "pinned state * dA + dB * x order): worst 1.1e-6 of max(|out|, 1) over 3000 draws; ~10x that."
        ),
    ),
    (TINY_HYBRID_ORDERS, torch.float32): AgreementBound(
        1e-5,
        (
            "The tiny hybrid model (runner.model.tiny_hybrid) prefilled in chunks or decoded token by token vs "
            "one-shot prefill, fp32: worst 7.8e-7 of max(|logits|, 1) over 20 seeds (batch 2, 2-30 tokens, a "
            "random split); ~13x that."
        ),
    ),
    (LLAMA_ORDERS, torch.float32): AgreementBound(
        5e-6,
        (
            "runner.model.llama (tiny dummy config, fp32, reference attention) prefilled in chunks over a cached "
            "prefix or decoded token by token vs one batched prefill: worst 4.4e-7 of max(|logits|, 1) over 200 "
            "seeds (1-3 sequences of 1-24 tokens, chunks 2-9, block sizes 4/16); ~11x that."
        ),
    ),
    (LLAMA_KERNELS, torch.float32): AgreementBound(
        2e-2,
        (
            "Tiny dummy Llama in bf16, logits (fp32 of the bf16 head GEMM) through the Triton kv_store / "
            "paged_prefill / paged_decode vs the reference path (fp64 ideal rounded to bf16): worst 5.7e-3 of "
            "max(|logits|, 1) (interpreter, 20 seeds) = one bf16 ulp of the largest logit; 2e-2 ~ 2.5 ulps there."
        ),
    ),
    (LLAMA_VS_HF, torch.float32): AgreementBound(
        2e-5,
        (
            "SmolLM2-135M-Instruct fp32 CPU, first-step logits of 8 chat prompts vs HF transformers 5.17 (sdpa, "
            "left-padded batch) on the same GGUF: worst 5.5e-5 at max |logit| 34.6 = 1.6e-6; ~12x that."
        ),
    ),
    (RUNNER_LOGPROBS, torch.float32): AgreementBound(
        6e-6,
        (
            "Engine logprobs (runner.engine.logprobs: sampled and prompt tokens, their top-20) vs log_softmax of one "
            "forward over the whole sequence, fp32 CPU, chunked (budgets 5 and 8) and whole prefills: worst 2.1e-7 "
            "of max(|logprobs of the position|, 1) on the tiny dummy Llama (20 seeds, 3 prompts of 1-30 tokens, 8 "
            "greedy tokens), 6.4e-7 on SmolLM2-135M (4 prompts, 6 tokens); ~10x that."
        ),
    ),
}
