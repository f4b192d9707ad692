"""Token -> expert assignment, sorted and padded to the grouped GEMM's row blocks (the `moe_align_block_size`
contract of vLLM's fused MoE, written here from its description).

Input: the router's expert ids `topk_ids` [T, k]; entry (t, j) is the flat index f = t * k + j.
Output (`Alignment`), for `block_size` rows a GEMM program takes:
- `sorted_token_ids` int32 [capacity]: the flat indices expert by expert (experts in ascending id order, each
  run ascending), every run padded with the sentinel T * k up to a multiple of block_size; an expert nobody
  chose has an empty run (no block). Entries past `num_tokens_post_padded` are the sentinel too.
- `expert_ids` int32 [capacity / block_size]: each block's expert, as a local id through `expert_map` under
  expert parallelism (-1: the expert lives on another rank, and the kernel writes zeros for the block's rows,
  so the ranks' partial outputs sum to the whole). Blocks past the used ones are -1.
- `num_tokens_post_padded` int32 [1]: the rows of used blocks (sum of the padded runs).
capacity = T * k + min(E, T * k) * (block_size - 1), rounded up to a multiple of block_size: the most any routing
needs (at most min(E, T * k) experts are chosen, and each run wastes at most block_size - 1 rows), so a kernel
can size its buffers and grid without a host sync. vLLM's bound is T * k + E * (block_size - 1), capped at
T * k * block_size when T * k < E; this one is never larger, and at decode it keeps a grouped GEMM's grid from
being mostly programs with no rows (DeepSeek-V3 at 1 token, E 256, top 8, blocks of 16: 8 blocks, not 241).
A token's row of the GEMM input is f // k (its hidden state), its weight topk_weights.flatten()[f].
`check_alignment` states the contract as checks a kernel's output must pass, with any order inside a run.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class Alignment:
    sorted_token_ids: torch.Tensor  # int32 [capacity]
    expert_ids: torch.Tensor  # int32 [capacity // block_size]
    num_tokens_post_padded: torch.Tensor  # int32 [1]


def capacity(num_assignments: int, num_experts: int, block_size: int) -> int:
    most = num_assignments + min(num_experts, num_assignments) * (block_size - 1)
    return -(-most // block_size) * block_size


def check_align_args(
    topk_ids: torch.Tensor, num_experts: int, block_size: int, expert_map=None, values: bool = True
) -> None:
    """TypeError/ValueError naming the argument. values=False skips the checks that read tensor values (a
    kernel launcher's, which must not sync; it checks an expert map's values itself outside graph capture)."""
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids: must be an int32/int64 tensor, got {getattr(topk_ids, 'dtype', type(topk_ids))}")
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids: must be [tokens, top_k], got shape {tuple(topk_ids.shape)}")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts: must be an int >= 1, got {num_experts!r}")
    if topk_ids.shape[1] > num_experts:
        raise ValueError(f"topk_ids: top_k {topk_ids.shape[1]} is larger than the {num_experts} experts")
    if values and topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= num_experts):
        raise ValueError(f"topk_ids: expert ids must be in [0, {num_experts})")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size: must be an int >= 1, got {block_size!r}")
    if expert_map is not None:
        if tuple(expert_map.shape) != (num_experts,) or expert_map.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"expert_map: must be int [{num_experts}] (local id or -1 per global expert)")
        if values:
            check_expert_map_values(expert_map, num_experts)


def check_expert_map_values(expert_map: torch.Tensor, num_experts: int) -> None:
    """ValueError unless every entry is -1 or a local id in [0, num_experts), no local id used twice."""
    local = expert_map[expert_map >= 0]
    if bool((expert_map < -1).any()) or (local.numel() and int(local.max()) >= num_experts):
        raise ValueError("expert_map: ids must be -1 (another rank's expert) or a local id in [0, experts)")
    if local.numel() != local.unique().numel():
        raise ValueError("expert_map: two global experts map to one local id")


def align_block_size(
    topk_ids: torch.Tensor, num_experts: int, block_size: int, expert_map: torch.Tensor | None = None
) -> Alignment:
    check_align_args(topk_ids, num_experts, block_size, expert_map)
    flat = topk_ids.flatten().to(torch.int64).cpu()
    n = flat.numel()
    cap = capacity(n, num_experts, block_size)
    sorted_ids = torch.full((cap,), n, dtype=torch.int32)
    expert_ids = torch.full((cap // block_size,), -1, dtype=torch.int32)
    order = torch.argsort(flat, stable=True)  # by expert, ascending flat index inside each
    counts = torch.bincount(flat, minlength=num_experts)
    mapping = expert_map.cpu() if expert_map is not None else torch.arange(num_experts)
    row = taken = 0
    for e in range(num_experts):
        c = int(counts[e])
        if c == 0:
            continue
        sorted_ids[row : row + c] = order[taken : taken + c].to(torch.int32)
        blocks = -(-c // block_size)
        expert_ids[row // block_size : row // block_size + blocks] = int(mapping[e])
        row, taken = row + blocks * block_size, taken + c
    return Alignment(sorted_ids, expert_ids, torch.tensor([row], dtype=torch.int32))


def check_alignment(
    alignment: Alignment, topk_ids: torch.Tensor, num_experts: int, block_size: int, expert_map=None
) -> None:
    """AssertionError naming the first broken rule of the contract (any order inside an expert's run)."""
    flat = topk_ids.flatten().to(torch.int64).cpu()
    n = flat.numel()
    ids = alignment.sorted_token_ids.cpu().to(torch.int64)
    blocks = alignment.expert_ids.cpu().to(torch.int64)
    cap = capacity(n, num_experts, block_size)
    assert ids.shape == (cap,), f"sorted_token_ids: {tuple(ids.shape)} entries, want capacity {cap}"
    assert blocks.shape == (cap // block_size,), f"expert_ids: {tuple(blocks.shape)}, want {cap // block_size}"
    used = int(alignment.num_tokens_post_padded.reshape(-1)[0])
    counts = torch.bincount(flat, minlength=num_experts)
    want_used = int(sum(-(-int(c) // block_size) * block_size for c in counts))
    assert used == want_used, f"num_tokens_post_padded: {used}, want {want_used}"
    assert bool((ids[used:] == n).all()), "sorted_token_ids: entries past num_tokens_post_padded must be the sentinel"
    assert bool((blocks[used // block_size :] == -1).all()), "expert_ids: blocks past the used ones must be -1"
    real = ids[:used][ids[:used] != n]
    assert real.numel() == n and bool((real.sort().values == torch.arange(n)).all()), (
        "sorted_token_ids: every (token, slot) must appear exactly once"
    )
    mapping = expert_map.cpu().to(torch.int64) if expert_map is not None else torch.arange(num_experts)
    row = 0
    for e in range(num_experts):  # runs in ascending expert order, each padded to whole blocks
        c = int(counts[e])
        if c == 0:
            continue
        nb = -(-c // block_size)
        run = ids[row : row + nb * block_size]
        assert bool((flat[run[:c]] == e).all()) if bool((run[:c] < n).all()) else False, (
            f"sorted_token_ids: expert {e}'s run (rows {row}..) holds another expert's token or a pad too early"
        )
        assert bool((run[c:] == n).all()), f"sorted_token_ids: expert {e}'s run must end in {nb * block_size - c} pads"
        got = blocks[row // block_size : row // block_size + nb]
        assert bool((got == int(mapping[e])).all()), f"expert_ids: expert {e}'s blocks say {got.tolist()}"
        row += nb * block_size
