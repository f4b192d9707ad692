"""The names of the tolerance families: the first half of every key of `LOSSY` and `AGREEMENT`.

A bench definition (`lossy_check(PAGED_DECODE)`) and a suite (`assert_lossy(PAGED_DECODE, ...)`) name the same
row through these constants, so a renamed family cannot leave one of them checking against nothing.
"""

# Lossy kernels, held to the precision-mirroring reference (max/RMS relative error) and the ideal (SQNR).
BLOCK_FP8_GEMM = "block_fp8_gemm"
W4A16_MXFP4_GEMM = "w4a16_mxfp4_gemm"
W4A16_NVFP4_GEMM = "w4a16_nvfp4_gemm"
PAGED_DECODE = "paged_decode"
PAGED_PREFILL = "paged_prefill"
MAMBA_STATE_UPDATE_OUT = "mamba_state_update"  # out, keyed by x's dtype
MAMBA_STATE_UPDATE_STATE = "mamba_state_update.state"  # the updated slots, keyed by the state's dtype
MAMBA_CONV1D_UPDATE = "mamba_conv1d_update"
RMS_NORM = "rms_norm"
SILU_AND_MUL = "silu_and_mul"
FUSED_MOE = "fused_moe"
BLOCK_FP8_MOE = "block_fp8_moe"
MXFP4_MOE = "mxfp4_moe"

# Two evaluation orders of the same math (no kernel, no quantization).
SSD_ORDERS = "ssd_orders"
TINY_HYBRID_ORDERS = "tiny_hybrid_orders"
LLAMA_ORDERS = "llama_orders"
LLAMA_KERNELS = "llama_kernels"
LLAMA_VS_HF = "llama_vs_hf"
RUNNER_LOGPROBS = "runner_logprobs"
