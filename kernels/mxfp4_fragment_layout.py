"""MXFP4 weights in mma.sync fragment order, prepared once at load for the tensor-core GEMV
(`kernels.w4a16_mxfp4_fragment_gemv`): codes as 32-bit words whose bits are placed so that each bf16x2 operand
register decodes in two integer ops, and the E8M0 scales as bf16.

Fragments. The GEMV computes y^T = W x^T with `mma.sync.m16n8k16` (bf16, fp32 accumulation): a warp takes 16 rows
of W and 64 of K (two MX blocks) a step. In the A fragment of m16n8k16 (PTX ISA, "Matrix Fragments for
mma.m16n8k16") lane l = 4 g + c holds rows g and g + 8, K columns 2c, 2c + 1, 2c + 8, 2c + 9; the MMA only
needs A's and B's K indices to agree, so the GEMV maps them onto the 8 consecutive elements 8c .. 8c + 7 of each
MX block. A lane then holds, for each of its two rows and two blocks, one interchange word (8 codes), and reads
x's elements 8c .. 8c + 7 of a block as four bf16 pairs, the B fragment as it is. Prepared words are stored
[row tile (N / 16), step (K / 64), lane (32), word (4)]; word 2b + h is block b of the step, row g + 8h. A warp's
step is 512 contiguous bytes, 16 a lane.

Bits. Element 2i of a word goes to the low half of operand register R_i, element 2i + 1 to the high half, each as
bf16 E2M1 value * 2**-126: sign at bit 15 (31), magnitude at 8:6 (24:22), the bits MASK keeps; the kernel
multiplies by 2**126 (exact). A register is taken out of the word as rotr(word, r) & mask: R0 at rotation 0, R1 at
4, R2 at 10; no four rotations of one mask tile 32 bits (the suite checks every choice), so R3 is two pieces: its
magnitudes' low bits at rotation 14, the rest at 6. That is 9 integer ops for 8 weights (the interchange order
needs 13: `kernels.w4a16_mxfp4_gemm._PACKED_DECODE_ASM`).

Scales: bf16 2**(s - 127) (byte 0 the subnormal 2**-127, 0xFF NaN), two to an int32 (rows g and g + 8 of one
block), stored [row tile, step, g (8), block (2)]: 2 bytes a block and row where the interchange layout has 1, so
the prepared weights are 6 % larger (4.5 bits a weight against 4.25); the GEMV turns a pair into two fp32
scales in two ops where the bytes would need four ops each (the 0 and 0xFF cases).

`decode_ptx` is the decode as PTX text (the kernels inline it), `decode_word` the same decode in torch (the CPU
tier's check of it); `interchange` undoes `prepare`.
"""

from __future__ import annotations

import torch

ROWS = 16  # rows of W a warp's fragment covers (m16)
STEP_K = 64  # K a step covers: two MX blocks
LANES = 32
MASK = 0x81C081C0  # sign and magnitude bits of both halves of a bf16x2 register
R3_LOW_MASK = 0x00400040  # R3's magnitude low bits (bit 6, 22), taken at rotation R3_LOW_ROTATION
R3_LOW_ROTATION, R3_REST_ROTATION = 14, 6
ROTATIONS = (0, 4, 10)  # R0, R1, R2


BIAS_BF16X2 = 0x7E807E80  # 2**126 in both bf16 halves


def decode_ptx(word: str, regs: tuple[str, ...]) -> str:
    """PTX: the prepared word register `word` -> bf16x2 registers regs (R0..R3, the E2M1 values, exact). Needs
    .b32 registers t, u and mk = MASK, bias = BIAS_BF16X2 declared around it."""
    r0, r1, r2 = ROTATIONS
    assert r0 == 0, "R0 is the word masked in place"
    lines = [f"and.b32 {regs[0]}, {word}, mk;"]
    for reg, rot in ((regs[1], r1), (regs[2], r2)):
        lines += [f"shf.r.wrap.b32 t, {word}, {word}, {rot};", f"and.b32 {reg}, t, mk;"]
    rest = MASK & ~R3_LOW_MASK
    lines += [
        f"shf.r.wrap.b32 t, {word}, {word}, {R3_LOW_ROTATION};",
        f"and.b32 u, t, {R3_LOW_MASK:#010x};",
        f"shf.r.wrap.b32 t, {word}, {word}, {R3_REST_ROTATION};",
        f"lop3.b32 {regs[3]}, u, t, {rest:#010x}, 0xF8;",  # u | (t & rest)
    ]
    lines += [f"mul.rn.bf16x2 {r}, {r}, bias;" for r in regs]  # * 2**126: the E2M1 value, a normal bf16
    return "\n".join(lines) + "\n"


def decode_block_ptx(scaled: bool = False) -> str:
    """A PTX block of the decode alone: $4 a prepared word -> $0..$3 its registers R0..R3; `scaled`: each register
    then multiplied by the bf16x2 scale pair $5 (exact: E2M1 values times powers of two; what the tiled GEMM and
    the dequantizer run). Also the text suites/ptx_subset.py runs on the CPU tier."""
    head = f"{{\n.reg .b32 t, u, mk, bias;\nmov.b32 mk, {MASK:#010x};\nmov.b32 bias, {BIAS_BF16X2:#010x};\n"
    body = decode_ptx("$4", ("$0", "$1", "$2", "$3"))
    if scaled:
        body += "".join(f"mul.rn.bf16x2 ${i}, ${i}, $5;\n" for i in range(4))
    return head + body + "}"


def _stored_bit(register: int, target: int) -> int:
    """Where the prepared word keeps the bit that lands at `target` (0..31) of operand register `register`."""
    if register < 3:
        rotation = ROTATIONS[register]
    else:
        rotation = R3_LOW_ROTATION if (1 << target) & R3_LOW_MASK else R3_REST_ROTATION
    return (target + rotation) % 32


def _bit_map() -> tuple[tuple[int, ...], ...]:
    """BIT_MAP[j][q]: the prepared word's bit for bit q (0..2 magnitude, 3 sign) of the word's element j."""
    rows = []
    for j in range(8):
        half = 16 * (j % 2)
        targets = (6 + half, 7 + half, 8 + half, 15 + half)
        rows.append(tuple(_stored_bit(j // 2, t) for t in targets))
    if sorted(b for row in rows for b in row) != list(range(32)):
        raise AssertionError("the fragment bit map is not a permutation of the word's 32 bits")
    return tuple(rows)


BIT_MAP = _bit_map()


def _check(codes: torch.Tensor, scales: torch.Tensor) -> tuple[int, int]:
    if codes.dtype != torch.uint8 or scales.dtype != torch.uint8 or codes.dim() < 2:
        raise TypeError(
            f"codes, scales: must be uint8 [..., N, K/2] and [..., N, K/32], got {codes.dtype}, {scales.dtype}"
        )
    n, k = codes.shape[-2], codes.shape[-1] * 2
    if scales.shape != (*codes.shape[:-1], k // 32):
        raise ValueError(f"scales: must be [..., N, K/32] = {(*codes.shape[:-1], k // 32)}, got {tuple(scales.shape)}")
    if n % ROWS or k % STEP_K:
        raise ValueError(f"codes: N must be a multiple of {ROWS} and K of {STEP_K}, got N = {n}, K = {k}")
    return n, k


def check_weights(words: torch.Tensor, pairs: torch.Tensor, name: str = "words", lead: int = 0) -> tuple[int, int]:
    """(N, K) of valid prepared weights (`prepare`'s words and scale pairs, with `lead` leading dims: 1 for a
    stack of experts); a one-line error naming the argument (`name` and `name`'s pairs) otherwise."""
    dims = "E, " * lead
    if words.dtype != torch.int32 or words.dim() != 4 + lead or tuple(words.shape[-2:]) != (LANES, 4):
        raise TypeError(
            f"{name}: must be int32 [{dims}N/16, K/64, 32, 4] (mxfp4_fragment_layout.prepare), got {words.dtype} "
            f"{tuple(words.shape)}"
        )
    want = (*words.shape[:-2], 8, 2)
    pairs_name = "pairs" if name == "words" else f"{name}_pairs"
    if pairs.dtype != torch.int32 or tuple(pairs.shape) != want:
        raise TypeError(f"{pairs_name}: must be int32 {want}, got {pairs.dtype} {tuple(pairs.shape)}")
    for what, tensor in ((name, words), (pairs_name, pairs)):
        if not tensor.is_contiguous():
            raise ValueError(f"{what}: must be contiguous (as mxfp4_fragment_layout.prepare returns it)")
    return words.shape[-4] * ROWS, words.shape[-3] * STEP_K


def _permute_bits(words: torch.Tensor, forward: bool) -> torch.Tensor:
    """int64 words (32 bits) with every bit moved by BIT_MAP (forward) or back."""
    out = torch.zeros_like(words)
    for j, row in enumerate(BIT_MAP):
        for q, stored in enumerate(row):
            src, dst = (4 * j + q, stored) if forward else (stored, 4 * j + q)
            out |= ((words >> src) & 1) << dst
    return out


def _to_int32(values: torch.Tensor) -> torch.Tensor:
    return torch.where(values >= 2**31, values - 2**32, values).to(torch.int32)


# Rows prepared at a time: the bit permutation works on 8-byte copies of the codes (about 4 live at once, 16x the
# codes' bytes), so a whole 28672 x 4096 gate_up would add ~0.9 GiB to a load's peak; 2048 rows of it add 64 MiB.
PREPARE_ROWS = 2048


def prepare(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Interchange codes [..., N, K/2] and E8M0 scales [..., N, K/32] (uint8) -> (words int32 [..., N/16, K/64, 32,
    4], scales int32 [..., N/16, K/64, 8, 2]), new contiguous tensors on the same device; PREPARE_ROWS rows at a
    time."""
    n, k = _check(codes, scales)
    lead = codes.shape[:-2]
    words = codes.new_empty((*lead, n // ROWS, k // STEP_K, LANES, 4), dtype=torch.int32)
    pairs = codes.new_empty((*lead, n // ROWS, k // STEP_K, 8, 2), dtype=torch.int32)
    for first in range(0, n, PREPARE_ROWS):
        rows = slice(first, first + PREPARE_ROWS)
        tiles = slice(first // ROWS, (first + PREPARE_ROWS) // ROWS)
        chunk = _prepare_rows(codes[..., rows, :], scales[..., rows, :])
        words[..., tiles, :, :, :], pairs[..., tiles, :, :, :] = chunk
    return words, pairs


def _prepare_rows(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`prepare` of rows whose count is a multiple of ROWS, in one pass."""
    n, k = codes.shape[-2], codes.shape[-1] * 2
    lead = codes.shape[:-2]
    words = codes.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # [..., N, K/8]
    words = _to_int32(_permute_bits(words, True))
    # [.., tile, h, g, step, b, c] -> [.., tile, step, g, c, b, h]
    words = words.reshape(*lead, n // ROWS, 2, 8, k // STEP_K, 2, 4)
    d = len(lead)
    words = words.permute(*range(d), d, d + 3, d + 2, d + 5, d + 4, d + 1).contiguous()
    s = scales.to(torch.int32)
    bf = torch.where(s == 0, 0x0040, torch.where(s == 255, 0x7FC0, s << 7)).to(torch.int64)
    bf = bf.reshape(*lead, n // ROWS, 2, 8, k // STEP_K, 2).permute(*range(d), d, d + 3, d + 2, d + 4, d + 1)
    pairs = _to_int32(bf[..., 0] | (bf[..., 1] << 16)).contiguous()
    return words.reshape(*lead, n // ROWS, k // STEP_K, LANES, 4), pairs


def interchange(words: torch.Tensor, pairs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`prepare`'s inverse: (codes uint8 [..., N, K/2], scales uint8 [..., N, K/32])."""
    lead = words.shape[:-4]
    d = len(lead)
    tiles, steps = words.shape[d], words.shape[d + 1]
    w = words.to(torch.int64).reshape(*lead, tiles, steps, 8, 4, 2, 2) & 0xFFFFFFFF  # .., tile, step, g, c, b, h
    w = w.permute(*range(d), d, d + 5, d + 2, d + 1, d + 4, d + 3)  # .., tile, h, g, step, b, c
    w = _to_int32(_permute_bits(w.reshape(*lead, tiles * ROWS, steps * 8), False))
    codes = w.contiguous().view(torch.uint8).reshape(*lead, tiles * ROWS, steps * STEP_K // 2)
    p = pairs.to(torch.int64) & 0xFFFFFFFF
    bf = torch.stack((p & 0xFFFF, p >> 16), dim=-1)  # .., tile, step, g, b, h
    bf = bf.permute(*range(d), d, d + 4, d + 2, d + 1, d + 3).reshape(*lead, tiles * ROWS, steps * 2)
    scales = torch.where(bf == 0x0040, 0, torch.where(bf == 0x7FC0, 255, bf >> 7)).to(torch.uint8)
    return codes, scales


def _rotr(words: torch.Tensor, r: int) -> torch.Tensor:
    return ((words >> r) | (words << (32 - r))) & 0xFFFFFFFF if r else words


def decode_word(words: torch.Tensor) -> torch.Tensor:
    """The kernel's decode of prepared words (int32 [...]) in torch: fp32 [..., 8], elements 0..7 of each word as
    E2M1 values (the kernel's bf16 registers times 2**126, exact)."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    regs = [_rotr(w, r) & MASK for r in ROTATIONS]
    regs.append((_rotr(w, R3_LOW_ROTATION) & R3_LOW_MASK) | (_rotr(w, R3_REST_ROTATION) & (MASK & ~R3_LOW_MASK)))
    halves = [h for r in regs for h in (r & 0xFFFF, r >> 16)]
    bits = torch.stack(halves, dim=-1).to(torch.int32) << 16  # bf16 -> fp32 bits
    return bits.view(torch.float32) * 2.0**126
