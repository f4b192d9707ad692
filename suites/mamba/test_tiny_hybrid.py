"""The tiny attention + Mamba2 hybrid model (runner.model.tiny_hybrid): seeded weights, prefill in chunks and
token-by-token decode against a one-shot prefill, greedy generation, states left untouched, state shapes equal
to the page math of reference.kv.hybrid."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernels.tolerances import assert_agree, families
from reference.kv.hybrid import MambaSpec, mamba2_state_shapes
from runner.model.tiny_hybrid import (
    AttentionKV,
    HybridStates,
    MambaState,
    TinyHybridConfig,
    TinyHybridModel,
    generate,
)


def assert_close_fp32(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == torch.float32, what
    assert_agree(families.TINY_HYBRID_ORDERS, got, want, what)


def prompt(seed: int, batch: int, length: int, vocab: int = 61) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_the_seed_fixes_weights_and_outputs():
    tokens = prompt(0, 1, 9)
    a, _ = TinyHybridModel(TinyHybridConfig(seed=3)).prefill(tokens)
    b, _ = TinyHybridModel(TinyHybridConfig(seed=3)).prefill(tokens)
    c, _ = TinyHybridModel(TinyHybridConfig(seed=4)).prefill(tokens)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@given(
    seed=st.integers(0, 3),
    length=st.integers(2, 24),
    data=st.data(),
    rope=st.sampled_from([10_000.0, None]),
    chunk=st.sampled_from([1, 4, 8]),
)
def test_chunked_prefill_and_decode_match_a_one_shot_prefill(seed, length, data, rope, chunk):
    model = TinyHybridModel(TinyHybridConfig(seed=seed, rope_theta=rope, mamba_chunk_size=chunk))
    tokens = prompt(seed, 2, length)
    whole, end = model.prefill(tokens)
    k = data.draw(st.integers(1, length - 1))
    first, states = model.prefill(tokens[:, :k])
    second, split_end = model.prefill(tokens[:, k:], states)
    assert_close_fp32(torch.cat([first, second], dim=1), whole, f"prefill split at {k}")
    steps = []
    for t in range(k, length):
        logits, states = model.decode(tokens[:, t], states)
        steps.append(logits)
    assert_close_fp32(torch.stack(steps, dim=1), whole[:, k:], f"decode from {k}")
    assert states.num_tokens == split_end.num_tokens == end.num_tokens == length
    for i, (got, want) in enumerate(zip(states.layers, end.layers, strict=True)):
        for name, g, w in zip(got._fields, got, want, strict=True):
            assert_close_fp32(g, w, f"layer {i} {name}")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_generation_equals_argmax_of_a_full_prefill_each_step(seed):
    model = TinyHybridModel(TinyHybridConfig(seed=seed))
    tokens = prompt(seed, 1, 7)
    got, logits = generate(model, tokens, max_new_tokens=6)
    assert got.shape == (1, 6) and logits.shape == (1, 6, 61)
    sequence = tokens
    for i in range(6):
        full, _ = model.prefill(sequence)
        assert_close_fp32(logits[:, i], full[:, -1], f"step {i}")
        assert int(full[0, -1].argmax()) == int(got[0, i]), f"step {i}"
        sequence = torch.cat([sequence, got[:, i : i + 1]], dim=1)
    assert len(set(got[0].tolist())) > 1  # the random model is not stuck on one token


def test_prefill_and_decode_leave_their_input_states_untouched():
    model = TinyHybridModel()
    _, states = model.prefill(prompt(1, 1, 6))
    before = [t.clone() for layer in states.layers for t in layer]
    model.prefill(prompt(2, 1, 3), states)
    model.decode(torch.tensor([5]), states)
    after = [t for layer in states.layers for t in layer]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_state_shapes_are_the_page_math_shapes():
    cfg = TinyHybridConfig()
    _, states = TinyHybridModel(cfg).prefill(prompt(0, 1, 5))
    conv, ssm = mamba2_state_shapes(
        intermediate_size=cfg.mamba_inner,
        n_groups=cfg.mamba_n_groups,
        num_heads=cfg.mamba_num_heads,
        head_dim=cfg.mamba_head_dim,
        state_size=cfg.mamba_state_size,
        conv_kernel=cfg.mamba_conv_kernel,
    )
    spec = MambaSpec(shapes=(conv, ssm), dtypes=(torch.float32, torch.float32))
    for kind, layer in zip(cfg.layer_types, states.layers, strict=True):
        if kind == "mamba":
            assert isinstance(layer, MambaState)
            assert (tuple(layer.conv.shape[1:]), tuple(layer.ssm.shape[1:])) == (conv, ssm)
            assert sum(t[0].numel() * t.element_size() for t in layer) == spec.page_bytes
        else:
            assert isinstance(layer, AttentionKV) and layer.k.shape == (
                1,
                5,
                cfg.num_attention_heads,
                cfg.attention_head_dim,
            )
    assert math.prod(ssm) * 4 + math.prod(conv) * 4 == spec.page_bytes


@pytest.mark.parametrize(
    ("call", "error", "name"),
    [
        (lambda m: m.prefill(torch.tensor([[1.0]])), TypeError, "tokens"),
        (lambda m: m.prefill(torch.tensor([[61]])), ValueError, "tokens"),
        (lambda m: m.prefill(torch.zeros(1, 0, dtype=torch.int64)), ValueError, "tokens"),
        (lambda m: m.decode(torch.tensor([[1]]), m.empty_states(1)), ValueError, "token"),
        (lambda m: m.decode(torch.tensor([1, 2]), m.empty_states(1)), ValueError, "states"),
        (lambda m: m.decode(torch.tensor([1]), HybridStates(0, ())), TypeError, "states"),
        (lambda m: m.decode(torch.tensor([1]), HybridStates(3, m.empty_states(1).layers)), ValueError, "states"),
        (lambda m: generate(m, torch.tensor([[1]]), 0), ValueError, "max_new_tokens"),
        (lambda m: TinyHybridConfig(layer_types=("mlp",)), ValueError, "layer_types"),
        (lambda m: TinyHybridConfig(mamba_n_groups=3), ValueError, "mamba_n_groups"),
        (lambda m: TinyHybridConfig(mamba_conv_kernel=1), ValueError, "mamba_conv_kernel"),
        (lambda m: TinyHybridConfig(hidden_size=0), ValueError, "hidden_size"),
    ],
)
def test_bad_arguments_name_the_argument(call, error, name):
    with pytest.raises(error, match=name):
        call(TinyHybridModel())
