"""A minimal greedy driver for the model tests: prefill a batch of prompts (optionally in chunks), then decode
one token per sequence per step, over a paged cache from reference.kv.allocate. Blocks are handed out in
order from block 1 (block 0 stays unused, the engine's null block); no scheduler, no prefix sharing."""

from __future__ import annotations

import torch

from reference.kv.allocate import allocate_kv_cache
from reference.kv.attention import FullAttentionSpec
from runner.model.attention import make_batch
from runner.model.config import LlamaConfig


def allocate(config: LlamaConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device) -> list:
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=config.num_key_value_heads, head_size=config.head_dim, dtype=dtype
    )
    kv = allocate_kv_cache(spec, num_blocks, config.num_hidden_layers, device=device)
    return [(views["k"], views["v"]) for views in kv.views]


def step(model, caches, tables, chunks: list[list[int]], starts: list[int], block_size: int, device):
    """One forward step: sequence b brings tokens chunks[b] at positions starts[b]...; returns the logits
    [B, vocab] at each sequence's last new token."""
    lens = [s + len(c) for s, c in zip(starts, chunks, strict=True)]
    batch = make_batch(tables, lens, [len(c) for c in chunks], block_size, device)
    ids = torch.tensor([t for c in chunks for t in c], dtype=torch.int64, device=device)
    positions = torch.cat([torch.arange(s, s + len(c)) for s, c in zip(starts, chunks, strict=True)]).to(device)
    hidden = model(ids, positions, batch, caches)
    return model.compute_logits(hidden[batch.logits_indices])


def greedy(
    model,
    prompts: list[list[int]],
    new_tokens: int,
    *,
    block_size: int = 16,
    prefill_chunk: int | None = None,
    device="cpu",
) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy tokens per prompt and the fp32 logits of the first generated position [B, vocab]. With
    `prefill_chunk`, prompts are prefilled `prefill_chunk` tokens per step (later chunks attend to the cached
    earlier ones)."""
    config = model.config
    per_seq = -(-(max(len(p) for p in prompts) + new_tokens) // block_size)
    caches = allocate(config, 1 + per_seq * len(prompts), block_size, model.dtype, device)
    tables = [list(range(1 + b * per_seq, 1 + (b + 1) * per_seq)) for b in range(len(prompts))]
    chunk = prefill_chunk or max(len(p) for p in prompts)
    done = [0] * len(prompts)
    first = torch.empty((len(prompts), config.vocab_size), dtype=torch.float32)
    while True:  # prefill: every sequence advances by up to `chunk` tokens a step, all in one batch
        todo = [b for b, p in enumerate(prompts) if done[b] < len(p)]
        if not todo:
            break
        chunks = [prompts[b][done[b] : done[b] + chunk] for b in todo]
        logits_part = step(
            model, caches, [tables[b] for b in todo], chunks, [done[b] for b in todo], block_size, device
        )
        for i, b in enumerate(todo):
            done[b] += len(chunks[i])
            if done[b] == len(prompts[b]):
                first[b] = logits_part[i].cpu()
    outputs = [[int(t)] for t in first.argmax(-1)]
    for _ in range(new_tokens - 1):
        logits = step(
            model,
            caches,
            tables,
            [[o[-1]] for o in outputs],
            [len(p) + len(o) - 1 for p, o in zip(prompts, outputs, strict=True)],
            block_size,
            device,
        )
        for o, t in zip(outputs, logits.argmax(-1).tolist(), strict=True):
            o.append(t)
    return outputs, first


def eager_and_graph_tokens(model, config: LlamaConfig, device, prompts: list[list[int]], max_tokens: int = 12):
    """{enforce_eager: greedy token ids of each prompt} from the engine (`runner.LLM`) on a loaded bf16 model,
    decoded eagerly (True) and through CUDA graphs (False): what the GPU tests compare."""
    from runner import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    tokens = {}
    for eager in (True, False):
        llm = LLM(
            device=device,
            loaded=(model, None, config),
            dtype=torch.bfloat16,
            max_num_seqs=8,
            max_model_len=128,
            num_kv_blocks=64,
            enforce_eager=eager,
        )
        tokens[eager] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        llm.close()
    return tokens
