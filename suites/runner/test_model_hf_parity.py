"""The default model (SmolLM2-135M-Instruct, Q4_1 GGUF) against HF transformers on the same file: greedy
tokens equal for 8 chat prompts x 32 new tokens, fp32, CPU; first-step logits close. HF dequantizes and
un-permutes q/k itself (transformers' GGUF loader), so equality also proves our loader's permutation, name
mapping and tied head, and the model's RoPE/RMSNorm/GQA/paged attention against an independent
implementation. HF runs the 8 prompts as one left-padded batch (its positions come from the attention mask).
The whole engine (`LLM(loaded=...)`: scheduler, step packing, sampler, one batched prefill then decodes) gives
the same greedy tokens as well, checked in the same test against the same cached HF result.

Measured (this file's load + generation, 2 busy cores): our load ~19 s with the tokenizer, HF load ~19 s,
each generation 6-8 s; the first-step logits differ by at most 5.5e-5 (max |logit| 35).
"""

from __future__ import annotations

import pytest
import torch

from kernels.tolerances import assert_agree, families
from runner.model.config import MODELS
from suites.runner.conftest import no_network, one_thread, require_model_packages
from suites.runner.model_driver import greedy

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain gravity to a child.",
    "List three prime numbers.",
    "Translate 'good morning' into Spanish.",
    "Who wrote Hamlet?",
    "Give me a tip for learning Python.",
    "What is 12 times 7?",
]
NEW_TOKENS = 32


@pytest.fixture(scope="session")
def prompts(smollm2) -> list[list[int]]:
    _, tok, _ = smollm2
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in QUESTIONS
    ]


@pytest.fixture(scope="session")
def hf_greedy(prompts) -> tuple[list[list[int]], torch.Tensor]:
    """HF's greedy tokens and first-step logits for `prompts` (one load + one generate per session)."""
    require_model_packages()
    from transformers import AutoModelForCausalLM

    from runner.model import gguf_path

    path = gguf_path("smollm2-135m-instruct")
    with one_thread(), no_network():
        hf = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32, local_files_only=True
        )
        width = max(len(p) for p in prompts)
        pad = hf.config.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        out = hf.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=0,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=pad,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences[:, width:].tolist(), out.logits[0].float()


@pytest.fixture(scope="session")
def our_greedy(smollm2, prompts) -> tuple[list[list[int]], torch.Tensor]:
    model, _, _ = smollm2
    with one_thread():
        return greedy(model, prompts, NEW_TOKENS)


def test_default_model_matches_hf(smollm2, prompts, our_greedy, hf_greedy):
    """One test on purpose: under pytest-xdist every worker that runs a test of this module loads both models
    (~40 s); one test keeps that to one worker."""
    from runner import LLM, SamplingParams

    _, tok, config = smollm2
    assert config == MODELS["smollm2-135m-instruct"].config  # the GGUF metadata is the registered shape
    assert (tok.bos_token_id, tok.eos_token_id) == (config.bos_token_id, config.eos_token_id) == (1, 2)
    assert tok.convert_ids_to_tokens([1, 2]) == ["<|im_start|>", "<|im_end|>"]
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(tok("Hello world, ça va?").input_ids) == "Hello world, ça va?"

    assert_agree(families.LLAMA_VS_HF, our_greedy[1], hf_greedy[1], "first-step logits")
    for q, a, b in zip(QUESTIONS, our_greedy[0], hf_greedy[0], strict=True):
        assert len(a) == NEW_TOKENS
        assert a == b, f"{q!r}: ours {tok.decode(a)!r}\n   HF {tok.decode(b)!r}"

    with one_thread():
        outs = LLM(device="cpu", loaded=smollm2).generate(
            prompts, SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True), use_tqdm=False
        )
    for q, out, b in zip(QUESTIONS, outs, hf_greedy[0], strict=True):
        assert out.token_ids == b, f"{q!r}: engine {tok.decode(out.token_ids)!r}\n   HF {tok.decode(b)!r}"
