"""The W1 peer (bench.llm.hf_peer) on the CPU: transformers continuous batching (`generate_batch`) on a 2-layer
dummy Llama gives every requested token, and the same greedy tokens as plain `generate` one prompt at a time;
W1 refuses a peer result with request errors instead of reporting 0 tok/s.

Regression: `generate_batch` wrapped in torch.inference_mode() made every request fail (HF's batching loop runs
in another thread, outside the mode, and updates inference tensors in place), and W1 printed 0 tok/s."""

from __future__ import annotations

import types

import pytest
import torch

from suites.runner.conftest import require_model_packages

TINY = types.SimpleNamespace(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    rope_theta=1e4,
    tie_word_embeddings=True,
    max_position_embeddings=128,
)
PROMPTS = [[5, 17, 3, 88, 41], [9, 2, 60], [11, 70, 12, 13, 94, 15, 30, 2, 7, 51, 33]]
OUTPUT_LEN = 6


@pytest.fixture(scope="module")
def tiny_hf():
    require_model_packages()
    from bench.llm import hf_peer

    torch.manual_seed(0)
    model = hf_peer.dummy_model(TINY, torch.float32, "cpu")
    with torch.no_grad():  # HF's init (std 0.02) makes every token repeat its input; wider weights do not
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model


def test_generate_batch_gives_every_token_and_plain_generate_greedy_tokens(tiny_hf):
    from bench.llm import hf_peer

    # Explicit num_blocks / max_batch_tokens: HF sizes them from free GPU memory only on CUDA.
    result = hf_peer.generate_batch(tiny_hf, PROMPTS, OUTPUT_LEN, block_size=16, num_blocks=16, max_batch_tokens=64)
    assert result["errors"] == [] and result["tokens"] == len(PROMPTS) * OUTPUT_LEN
    tiny_hf.set_attn_implementation("sdpa")  # plain generate refuses the paged implementation
    try:
        want = hf_peer.generate_greedy(tiny_hf, PROMPTS, OUTPUT_LEN)["token_ids"]
    finally:
        tiny_hf.set_attn_implementation("paged|sdpa")
    assert len({tuple(t) for t in want}) > 1 and any(len(set(t)) > 1 for t in want)  # not a degenerate model
    assert result["token_ids"] == want


def test_w1_raises_on_peer_errors_instead_of_a_zero_row():
    from bench.llm import w1
    from bench.llm.workload import W1

    failed = dict(tokens=0, wall=1.0, span=0.5, errors=["Inplace update to inference tensor"], token_ids=[[]])
    with pytest.raises(RuntimeError, match="1 request errors, 0 tokens; first: Inplace update"):
        w1._peer_rows(W1, failed, [[1, 2]], "hf generate_batch", "note")
    ok = dict(failed, tokens=4, errors=[], token_ids=[[1, 2, 3, 4]])
    rows = w1._peer_rows(W1, ok, [[1, 2]], "hf generate_batch", "note")
    assert [r["output_tok_per_s"] for r in rows] == [4.0, 8.0]
