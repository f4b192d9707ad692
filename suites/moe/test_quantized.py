"""Paired references of the quantized MoE paths (`reference.moe.quantized`): each mirror against its ideal
(SQNR), each ideal against the unquantized layer (the format's own loss, reported as SQNR), named shape checks,
and negative controls a kernel's check must catch through these references: a block-FP8 scale read from the
neighbouring K block, an MXFP4 scale read past the last block, gate and up swapped."""

from __future__ import annotations

import pytest
import torch

from kernels.tolerances import sqnr_db
from reference.moe import quantized as q
from reference.moe import routing
from reference.moe.experts import fused_moe_ideal
from reference.quant.fp8 import quantize_fp8_blocks
from reference.quant.mxfp4 import quantize_mxfp4

# Measured over seeds 0-5 (bf16 activations, H 256, I 128, 8 experts, top 2). Mirror vs ideal: block-FP8
# 32.5-33.1 dB (the mirror quantizes the intermediate to FP8, the ideal does not), MXFP4 50.6-50.9 dB (bf16
# roundings only). Ideal vs the unquantized layer, the format's own loss: block-FP8 24.2-24.7 dB, MXFP4 13.7-14.4.
MIRROR_SQNR_DB = {"block_fp8": 30.0, "mxfp4": 45.0}
FORMAT_SQNR_DB = {"block_fp8": 22.0, "mxfp4": 12.0}


def _layer(seed: int, tokens: int = 24, hidden: int = 256, inter: int = 128, experts: int = 8, top_k: int = 2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(torch.bfloat16)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * hidden**-0.5
    w2 = torch.randn(experts, hidden, inter, generator=g) * inter**-0.5
    weights, ids = routing.softmax_topk(torch.randn(tokens, experts, generator=g), top_k, renormalize=True)
    return x, w13, w2, weights, ids


def _fp8(w: torch.Tensor):
    parts = [quantize_fp8_blocks(e) for e in w]
    return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])


def _mx(w: torch.Tensor):
    codes, scales = quantize_mxfp4(w)
    return codes, scales


def _block_fp8(seed: int):
    x, w13, w2, weights, ids = _layer(seed)
    return (x, *_fp8(w13), *_fp8(w2), weights, ids), (x, w13, w2, weights, ids)


def _mxfp4(seed: int):
    x, w13, w2, weights, ids = _layer(seed)
    return (x, *_mx(w13), *_mx(w2), weights, ids), (x, w13, w2, weights, ids)


PATHS = {
    "block_fp8": (_block_fp8, q.block_fp8_moe_mirror, q.block_fp8_moe_ideal),
    "mxfp4": (_mxfp4, q.mxfp4_moe_mirror, q.mxfp4_moe_ideal),
}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mirror_tracks_ideal_and_ideal_tracks_the_unquantized_layer(path, seed):
    make, mirror, ideal = PATHS[path]
    args, plain = make(seed)
    got, want = mirror(*args), ideal(*args)
    assert got.dtype == torch.bfloat16 and got.shape == plain[0].shape
    assert sqnr_db(got, want) > MIRROR_SQNR_DB[path]
    assert sqnr_db(want, fused_moe_ideal(*plain)) > FORMAT_SQNR_DB[path]


def test_negative_control_block_fp8_scale_from_the_neighbouring_block():
    args, _ = _block_fp8(0)
    x, w13, w13_s, w2, w2_s, weights, ids = args
    ideal = q.block_fp8_moe_ideal(*args)
    shifted = w13_s.roll(1, dims=2)  # each K block reads its neighbour's scale
    assert sqnr_db(q.block_fp8_moe_mirror(x, w13, shifted, w2, w2_s, weights, ids), ideal) < MIRROR_SQNR_DB["block_fp8"]


def test_negative_control_mxfp4_scale_read_past_the_last_block():
    args, _ = _mxfp4(0)
    x, w13, w13_s, w2, w2_s, weights, ids = args
    ideal = q.mxfp4_moe_ideal(*args)
    assert bool((ids == w2_s.shape[0] - 1).any())  # the last expert is routed to: the control is not vacuous
    for past in (0xFF, 0x00, 0x85):  # what lies beyond the buffer: NaN's byte, zeroed memory, a stray byte
        bad = w2_s.clone()
        bad[-1, -1, -1] = past  # the last expert's last row reads one block too far
        got = q.mxfp4_moe_mirror(x, w13, w13_s, w2, bad, weights, ids)
        assert bool(got.isnan().any()) or sqnr_db(got, ideal) < MIRROR_SQNR_DB["mxfp4"], past


def test_negative_control_gate_up_swap():
    args, _ = _block_fp8(1)
    x, w13, w13_s, w2, w2_s, weights, ids = args
    swap = lambda t: torch.cat(t.chunk(2, dim=1)[::-1], dim=1)
    got = q.block_fp8_moe_mirror(x, swap(w13), swap(w13_s), w2, w2_s, weights, ids)
    assert sqnr_db(got, q.block_fp8_moe_ideal(*args)) < 10.0


def test_bad_arguments_are_named():
    args, _ = _block_fp8(0)
    x, w13, w13_s, w2, w2_s, weights, ids = args
    with pytest.raises(ValueError, match="w13_scales"):
        q.block_fp8_moe_mirror(x, w13, w13_s[:, :1], w2, w2_s, weights, ids)
    with pytest.raises(TypeError, match="w2"):
        q.block_fp8_moe_ideal(x, w13, w13_s, w2.float(), w2_s, weights, ids)
    margs, _ = _mxfp4(0)
    x, c13, s13, c2, s2, weights, ids = margs
    with pytest.raises(ValueError, match="w2_scales"):
        q.mxfp4_moe_mirror(x, c13, s13, c2, s2[:, :, :1], weights, ids)
    with pytest.raises(ValueError, match="topk_ids"):
        q.mxfp4_moe_ideal(x, c13, s13, c2, s2, weights, ids + 8)
