"""Prefill CUDA graphs, the parts that run without a GPU: the token buckets, the static buffers' fill (the
step's rows and sequences, then padding rows that store nothing and padding sequences with no token), the
replay branch with fake graphs (the forward over the buffers, as a capture records it) and the eager
fallback; and the padding contract on the paged-prefill kernel itself (interpreter on the CPU tier): a step
padded to a bucket gives its real rows bit for bit, and with its padding rows counted as the last sequence's
(the planted bug) it does not. Real capture and replay: the gpu_only test at the end, and
suites/runner/test_llm_gpu.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from runner.engine.prefill_graphs import PrefillGraphs, StaticPrefillBuffers, prefill_capture_sizes
from runner.model.attention import AttentionBatch
from suites.attention.paged_cases import build, on

kernel = pytest.importorskip("kernels.paged_prefill")


@dataclasses.dataclass
class _Step:  # the fields of runner.engine.scheduler_output.StepInputs the graphs read
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor


def _step(news: list[int], width: int) -> _Step:
    t, b = sum(news), len(news)
    return _Step(
        input_ids=torch.arange(100, 100 + t, dtype=torch.int64),
        positions=torch.arange(10, 10 + t, dtype=torch.int64),
        slot_mapping=torch.arange(50, 50 + t, dtype=torch.int64),
        block_table=torch.arange(1, 1 + b * width, dtype=torch.int32).view(b, width),
        seq_lens=torch.tensor([n + 7 for n in news], dtype=torch.int32),
        cu_seqlens_q=torch.tensor([0, *torch.tensor(news).cumsum(0).tolist()], dtype=torch.int32),
    )


def test_buckets_step_by_a_half_and_end_at_the_budget():
    assert prefill_capture_sizes(16384) == [512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384]
    assert prefill_capture_sizes(1000) == [512, 768, 1000]
    assert prefill_capture_sizes(64) == [64]
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        prefill_capture_sizes(0)


def test_fill_pads_rows_and_sequences_and_forgets_a_larger_previous_step():
    buffers = StaticPrefillBuffers(max_tokens=16, max_seqs=4, max_blocks=3, device="cpu")
    buffers.fill(_step([6, 5, 3], 3), 16)  # a larger step first: none of it may survive
    buffers.fill(_step([2, 3], 2), 8)
    assert buffers.input_ids[:8].tolist() == [100, 101, 102, 103, 104, 0, 0, 0]
    assert buffers.positions[:8].tolist() == [10, 11, 12, 13, 14, 0, 0, 0]
    assert buffers.slot_mapping.tolist() == [50, 51, 52, 53, 54] + [-1] * 11  # the KV store skips pad rows
    assert buffers.seq_lens.tolist() == [9, 10, 0, 0]  # padding sequences: nothing in the cache
    assert buffers.block_table.tolist() == [[1, 2, 0], [3, 4, 0], [0, 0, 0], [0, 0, 0]]
    assert buffers.cu_seqlens_q.tolist() == [0, 2, 5, 5, 5]  # padding sequences start after the last real row
    batch = buffers.batch(8, AttentionBatch)
    assert not batch.is_decode and batch.slot_mapping.shape == (8,) and batch.seq_lens.shape == (4,)


def test_fill_refuses_a_step_that_does_not_fit():
    buffers = StaticPrefillBuffers(max_tokens=8, max_seqs=2, max_blocks=2, device="cpu")
    with pytest.raises(ValueError, match="size"):
        buffers.fill(_step([5, 4], 2), 8)
    with pytest.raises(ValueError, match="size"):
        buffers.fill(_step([1, 1, 1], 2), 8)
    with pytest.raises(ValueError, match="block_table"):
        buffers.fill(_step([2], 3), 8)


class _FakeGraph:
    """A captured graph of `size` as replay runs it: the forward over the static buffers' first `size` rows."""

    def __init__(self, graphs: PrefillGraphs, size: int):
        self.graphs, self.size, self.replays = graphs, size, 0

    def replay(self) -> None:
        g, n = self.graphs, self.size
        g.hidden[:n] = g.forward(g.buffers.input_ids[:n], g.buffers.positions[:n], g.buffers.batch(n, g.make_batch))
        self.replays += 1


def _row_forward(ids, pos, batch):
    """hidden row i = (token, position, slot) of row i."""
    return torch.stack([c.to(torch.float32) for c in (ids, pos, batch.slot_mapping)], dim=1)


def test_replay_pads_to_the_next_bucket_and_larger_steps_go_eager():
    graphs = PrefillGraphs(_row_forward, AttentionBatch, [], 4, 3, 3, torch.float32, "cpu")
    graphs.sizes = [8, 16]
    graphs.buffers = StaticPrefillBuffers(16, 4, 3, "cpu")
    graphs.hidden = torch.zeros(16, 3)
    graphs.graphs = {s: _FakeGraph(graphs, s) for s in graphs.sizes}
    for news, size in [([6, 5, 3], 16), ([2, 3], 8)]:
        step = _step(news, 3)
        out = graphs.run(step, lambda: pytest.fail("eager batch built for a step a graph covers"))
        assert graphs.graphs[size].replays >= 1
        assert torch.equal(out, _row_forward(step.input_ids, step.positions, step))
    eager = _step([9, 9], 3)  # 18 rows > 16: the eager forward on the step's own batch
    out = graphs.run(eager, lambda: eager)
    assert torch.equal(out, _row_forward(eager.input_ids, eager.positions, eager))
    assert [g.replays for g in graphs.graphs.values()] == [1, 1]


def test_cpu_captures_nothing():
    graphs = PrefillGraphs(_row_forward, AttentionBatch, [8, 16], 4, 3, 3, torch.float32, "cpu")
    assert graphs.capture() is None and graphs.graphs == {} and graphs.buffers is None
    step = _step([2, 3], 3)
    assert torch.equal(graphs.run(step, lambda: step), _row_forward(step.input_ids, step.positions, step))


def _padded_problem(last_takes_padding: bool = False):
    """A ragged 3-sequence prefill (cached prefixes, GQA 2) and the same step padded as the graphs pad it: 17 more
    rows of garbage queries, 5 more sequences with no token and an empty cache. `last_takes_padding`: the
    planted bug, the padding rows counted as the last real sequence's (its cu_seqlens end at the bucket's end),
    which moves where that sequence's queries sit in its cache."""
    p = dict(
        dtype=torch.bfloat16, block_size=16, kv_heads=2, group=2, head=64, news=[9, 1, 21], seq_lens=[30, 1, 40],
        num_splits=1, share_prefix=False, extra_width=1, spare_blocks=2, unused="garbage", sharpness=4.0, seed=11,
    )  # fmt: skip
    _, k_cache, v_cache, table, lens, scale = build(p)
    gen = torch.Generator().manual_seed(3)
    t = sum(p["news"])
    q = (torch.randn(t, 4, 64, generator=gen) * 4).bfloat16()
    cu = torch.tensor([0, 9, 10, 31], dtype=torch.int32)
    pad_rows, pad_seqs = 17, 5
    q_pad = torch.cat([q, (torch.randn(pad_rows, 4, 64, generator=gen) * 1e3).bfloat16()])
    table_pad = torch.cat([table, torch.zeros(pad_seqs, table.shape[1], dtype=torch.int32)])
    lens_pad = torch.cat([lens, torch.zeros(pad_seqs, dtype=torch.int32)])
    end = t + pad_rows if last_takes_padding else t
    cu_pad = torch.cat([cu[:-1], torch.full((pad_seqs + 1,), end, dtype=torch.int32)])
    return (q, k_cache, v_cache, table, lens, cu, scale), (q_pad, k_cache, v_cache, table_pad, lens_pad, cu_pad, scale)


def test_paged_prefill_gives_the_real_rows_of_a_padded_step_bit_for_bit(device):
    step, padded = _padded_problem()
    want = kernel.launch_paged_prefill(*on(device, *step[:6]), step[6])
    got = kernel.launch_paged_prefill(*on(device, *padded[:6]), padded[6])
    assert torch.equal(got[: want.shape[0]].cpu(), want.cpu())


def test_negative_control_padding_rows_given_to_the_last_sequence_break_it(device):
    step, padded = _padded_problem(last_takes_padding=True)
    want = kernel.launch_paged_prefill(*on(device, *step[:6]), step[6])
    got = kernel.launch_paged_prefill(*on(device, *padded[:6]), padded[6])
    assert not torch.equal(got[: want.shape[0]].cpu(), want.cpu())


@pytest.mark.gpu_only(reason="captures and replays CUDA graphs")
def test_prefill_graphs_give_the_eager_tokens(device):
    """A tiny dummy Llama in bf16: prompts of 3-60 tokens in steps of up to 64 tokens (chunked, the last prompt
    split over two steps) through the prefill graphs give the tokens of the same engine with prefill graphs
    off, and every step with prompt tokens replays."""
    from runner import LLM, SamplingParams
    from suites.runner import tiny_llama

    config = tiny_llama.SMALL_GPU
    model = tiny_llama.model(config, device, torch.bfloat16)
    prompts = [[(13 * i + 5 * j) % 500 + 1 for j in range(3 + 19 * i)] for i in range(4)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    tokens, replays = {}, 0
    for on_ in (False, True):
        llm = LLM(
            device=device, loaded=(model, None, config), dtype=torch.bfloat16, max_num_seqs=8,
            max_num_batched_tokens=64, max_model_len=128, num_kv_blocks=64, cuda_graph_prefill=on_,
        )  # fmt: skip
        graphs = llm.engine.runner.prefill_graphs.graphs
        assert sorted(graphs) == ([64] if on_ else [])
        for graph in graphs.values():

            def counted(real=graph.replay):
                nonlocal replays
                replays += 1
                real()

            graph.replay = counted
        tokens[on_] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert tokens[True] == tokens[False]
    assert replays == 2  # 126 prompt tokens in steps of at most 64: two steps with prompt tokens


def test_capture_all_goes_largest_first_into_one_pool(monkeypatch):
    """The capture loop both graph kinds share, with torch.cuda's graph API faked on the CPU: a warm-up run
    then a captured run per size, largest first; the first graph's pool (or the one passed in) holds them all."""
    import contextlib

    from runner.engine import cuda_graphs

    pools_seen, order = [], []

    class FakeGraph:
        def pool(self):
            return ("pool of", id(self))

    @contextlib.contextmanager
    def fake_graph(graph, pool=None):
        pools_seen.append(pool)
        yield

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)

    def forward(ids, pos, batch):
        order.append(ids.shape[0])
        return _row_forward(ids, pos, batch)

    buffers = StaticPrefillBuffers(16, 4, 3, "cpu")
    hidden = torch.full((16, 3), 7.0)
    graphs, pool = cuda_graphs.capture_all(forward, AttentionBatch, buffers, hidden, [8, 16, 4], "cpu")
    assert order == [16, 16, 8, 8, 4, 4] and sorted(graphs) == [4, 8, 16]
    assert pools_seen == [None, pool, pool] and pool == graphs[16].pool()
    assert torch.equal(hidden[:, 2], torch.full((16,), -1.0))  # every slot of the padding rows: -1
    _, again = cuda_graphs.capture_all(forward, AttentionBatch, buffers, hidden, [4], "cpu", pool="shared")
    assert again == "shared" and pools_seen[-1] == "shared"
