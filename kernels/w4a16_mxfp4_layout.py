"""The W4A16 MXFP4 GEMM's weight layout, prepared once at load: the codes with the nibbles of every 32-bit word
(8 consecutive codes along K, 4 code bytes) reordered so that the kernels' packed decode yields weights in K
order. Scales stay the interchange E8M0 bytes [N, K / 32].

Why: the packed decode (`kernels.w4a16_mxfp4_gemm._PACKED_DECODE_ASM`) turns one word into four bf16x2 registers,
each a pair of nibbles 16 bits apart (nibbles j and j + 4), taken in the order j = 0, 1, 2, 3. In the interchange
order (`reference.formats.nibbles`: element 2i low, 2i + 1 high) those registers hold elements (0, 4), (1, 5),
(2, 6), (3, 7), so the tensor-core path has to permute x to meet them. Prepared, a word's low 16 bits hold its
even elements and its high 16 bits its odd ones (nibble p holds element `PERMUTATION[p]`), so the registers hold
(0, 1), (2, 3), (4, 5), (6, 7) and x is read as it is. `interchange_codes` undoes `prepare_codes`. Torch only;
the kernels read the result (`kernels.w4a16_mxfp4_gemm.w4a16_mxfp4_gemm_prepared`).
"""

from __future__ import annotations

import torch

# Nibble p of a prepared word (p = 2 * byte + (1 if high nibble)) holds the word's element PERMUTATION[p];
# INVERSE[e] is the nibble that holds element e.
PERMUTATION = (0, 2, 4, 6, 1, 3, 5, 7)
INVERSE = tuple(PERMUTATION.index(e) for e in range(8))
CODES_PER_WORD = 8


def _reorder_words(codes: torch.Tensor, order: tuple[int, ...], name: str) -> torch.Tensor:
    """Nibble p of every word of the result is nibble order[p] of the same word of `codes`."""
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8 or codes.dim() < 1:
        raise TypeError(
            f"{name}: must be a uint8 tensor of packed E2M1 codes, got {getattr(codes, 'dtype', type(codes))}"
        )
    if codes.shape[-1] % (CODES_PER_WORD // 2):
        raise ValueError(
            f"{name}: the last dim holds {codes.shape[-1]} code bytes, not whole 32-bit words of 8 codes "
            f"(a multiple of {CODES_PER_WORD // 2})"
        )
    words = codes.shape[-1] // (CODES_PER_WORD // 2)
    nibbles = torch.stack((codes & 0xF, codes >> 4), dim=-1).reshape(*codes.shape[:-1], words, CODES_PER_WORD)
    nibbles = nibbles[..., list(order)].reshape(*codes.shape[:-1], words * CODES_PER_WORD // 2, 2)
    return (nibbles[..., 0] | (nibbles[..., 1] << 4)).to(torch.uint8).reshape(codes.shape)


def prepare_codes(codes: torch.Tensor) -> torch.Tensor:
    """Interchange codes [..., K / 2] (uint8, `reference.quant.mxfp4`'s layout) -> the prepared layout (new tensor)."""
    return _reorder_words(codes, PERMUTATION, "codes")


def interchange_codes(prepared: torch.Tensor) -> torch.Tensor:
    """Prepared codes -> the interchange layout (the inverse of `prepare_codes`)."""
    return _reorder_words(prepared, INVERSE, "prepared")
