"""Mamba state offload and the boundary rule (runner.model.state_offload, reference.mamba.align): the tiny
hybrid model run cold and through a restore from CPU-offloaded states must give the same greedy tokens AND
the same logits, bit for bit (fp32 states: a restore is lossless, so any difference is the bug), at prompt
lengths k*align - 1, k*align, k*align + 1 and a one-token-shifted prompt (the exact-boundary and mid-block
prompts of vLLM's CPU-offload test). Negative control: with the rule off, a prompt of exactly k*align tokens
restores a state that already contains its last token, which is then applied twice, and the check fails."""

from __future__ import annotations

import pytest
import torch

from kernels.tolerances import assert_exact
from reference.mamba.align import max_restorable_tokens, saved_state_positions
from runner.model.state_offload import PrefixStateStore, block_keys, generate_with_offload
from runner.model.tiny_hybrid import TinyHybridConfig, TinyHybridModel

ALIGN = 8  # tokens per offloaded block; the SSD chunk (4) divides it, as vLLM's "all" mode arranges
K = 3
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def model() -> TinyHybridModel:
    return TinyHybridModel(TinyHybridConfig(seed=0, mamba_chunk_size=4))


def prompt_of(length: int, seed: int = 0) -> list[int]:
    return torch.randint(1, 61, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def cold_then_restored(model, prompt, budget, fault="none"):
    store = PrefixStateStore(ALIGN)
    cold = generate_with_offload(model, prompt, store, max_new_tokens=NEW_TOKENS, token_budget=budget)
    restored = generate_with_offload(model, prompt, store, max_new_tokens=NEW_TOKENS, token_budget=budget, fault=fault)
    return store, cold, restored


def assert_same_output(cold, restored) -> None:
    assert_exact(restored.tokens, cold.tokens, "greedy tokens")
    assert_exact(restored.logits, cold.logits, "logits")


PROMPTS = {
    "k*align-1": prompt_of(K * ALIGN - 1),
    "k*align": prompt_of(K * ALIGN),
    "k*align+1": prompt_of(K * ALIGN + 1),
    "shifted": [0, *prompt_of(K * ALIGN)],  # vLLM's "block-mid" prompt: [0] + the boundary prompt
}


@pytest.mark.parametrize("budget", [ALIGN, 2 * ALIGN + 3])
@pytest.mark.parametrize("case", list(PROMPTS))
def test_restored_run_equals_cold_run(model, case, budget):
    prompt = PROMPTS[case]
    store, cold, restored = cold_then_restored(model, prompt, budget)
    assert cold.hit_tokens == 0
    # align mode saved a state wherever a cold chunk ended on a boundary; the hit is the last one the rule allows
    saved = saved_state_positions("align", ALIGN, [e for _, e in cold.chunks])
    keys = block_keys(prompt, ALIGN)
    assert [p for p in range(ALIGN, len(prompt) + 1, ALIGN) if store.blocks[keys[p // ALIGN - 1]].mamba] == list(saved)
    allowed = max_restorable_tokens(len(prompt), ALIGN)
    assert restored.hit_tokens == max(p for p in (0, *saved) if p <= allowed) > 0
    assert restored.chunks == tuple(c for c in cold.chunks if c[0] >= restored.hit_tokens)
    assert_same_output(cold, restored)


def test_a_later_request_sharing_the_prefix_restores_it(model):
    first = prompt_of(K * ALIGN + 1)
    later = first[: 2 * ALIGN + 3] + prompt_of(9, seed=5)
    store = PrefixStateStore(ALIGN)
    generate_with_offload(model, first, store, max_new_tokens=2, token_budget=ALIGN)
    restored = generate_with_offload(model, later, store, max_new_tokens=NEW_TOKENS, token_budget=ALIGN)
    cold = generate_with_offload(model, later, PrefixStateStore(ALIGN), max_new_tokens=NEW_TOKENS, token_budget=ALIGN)
    assert restored.hit_tokens == 2 * ALIGN and cold.hit_tokens == 0
    assert_same_output(cold, restored)


@pytest.mark.parametrize("budget", [ALIGN, 2 * ALIGN])
def test_negative_control_rule_off_at_a_boundary_applies_the_last_token_twice(model, budget):
    prompt = PROMPTS["k*align"]
    _, cold, restored = cold_then_restored(model, prompt, budget, fault="hit_includes_last_token")
    assert restored.hit_tokens == len(prompt)  # the restored state already contains the last prompt token
    assert restored.chunks == ((len(prompt) - 1, len(prompt)),)  # ... which is computed again for its logits
    with pytest.raises(AssertionError, match="not bit-exact"):
        assert_same_output(cold, restored)


@pytest.mark.parametrize("case", ["k*align-1", "k*align+1"])
def test_the_fault_only_matters_on_a_boundary(model, case):
    """Off a boundary round_down(n, align) = round_down(n - 1, align): the fault is invisible there, which is
    why a test needs the exact-boundary prompt."""
    _, cold, restored = cold_then_restored(model, PROMPTS[case], ALIGN, fault="hit_includes_last_token")
    assert_same_output(cold, restored)


def test_offloaded_states_are_cpu_copies(model):
    store, _, _ = cold_then_restored(model, PROMPTS["k*align+1"], ALIGN)
    block = store.blocks[block_keys(PROMPTS["k*align+1"], ALIGN)[0]]
    tensors = [t for kv in block.kv for t in kv] + [t for s in block.mamba for t in s]
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
    assert all(kv.k.shape[1] == ALIGN for kv in block.kv)


@pytest.mark.parametrize(
    ("call", "error", "name"),
    [
        (lambda m: PrefixStateStore(0), ValueError, "align"),
        (
            lambda m: generate_with_offload(m, [], PrefixStateStore(ALIGN), max_new_tokens=1, token_budget=ALIGN),
            TypeError,
            "prompt",
        ),
        (
            lambda m: generate_with_offload(
                m, [1, 2], PrefixStateStore(ALIGN), max_new_tokens=1, token_budget=ALIGN, fault="other"
            ),
            ValueError,
            "fault",
        ),
    ],
)
def test_bad_arguments_name_the_argument(model, call, error, name):
    with pytest.raises(error, match=name):
        call(model)
