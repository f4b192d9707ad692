"""Loading the default model reads its GGUF file once: the tokenizer is built from the metadata the weights'
reader already parsed, not by transformers' AutoTokenizer reading the file twice more. Counted two ways: the
gguf-py readers constructed, and the opens of the file. And the tokenizer so built is the one transformers
builds from the same file (its backend's serialization, the chat template, the special tokens)."""

from __future__ import annotations

import builtins
import os

import pytest
import torch

from suites.runner.conftest import one_thread, require_model_packages

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
TEXTS = ["The capital of France is", "  two  spaces\n\ttab", "Café naïve — 東京 🚀", "<|im_start|>user\nhi<|im_end|>"]


@pytest.fixture(scope="module")
def gguf_file():
    require_model_packages()
    from runner.model import gguf_path

    return gguf_path("smollm2-135m-instruct")


def test_a_load_reads_the_gguf_file_once(gguf_file, monkeypatch):
    import gguf

    readers, opens = [], []
    real_reader, real_open = gguf.GGUFReader, builtins.open

    class CountingReader(real_reader):
        def __init__(self, path, *args, **kwargs):
            readers.append(path)
            super().__init__(path, *args, **kwargs)

    def counting_open(file, *args, **kwargs):
        if isinstance(file, str | os.PathLike) and os.path.realpath(file) == os.path.realpath(gguf_file):
            opens.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    monkeypatch.setattr(builtins, "open", counting_open)
    from runner.model import load_model

    with one_thread():
        _, tokenizer, config = load_model("smollm2-135m-instruct", dtype=torch.float32, device="cpu")
    assert tokenizer is not None and tokenizer.chat_template and config.vocab_size == 49152
    assert len(readers) == 1, readers
    assert len(opens) == 1, opens


def test_the_tokenizer_is_the_one_transformers_builds_from_the_file(gguf_file, smollm2):
    from transformers import AutoTokenizer

    ours = smollm2[1]
    theirs = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name, local_files_only=True)
    assert type(ours) is type(theirs)
    assert ours.backend_tokenizer.to_str() == theirs.backend_tokenizer.to_str()
    assert ours.chat_template == theirs.chat_template
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text), text
    # what runner.model.tokenizer corrects: transformers names <|im_start|> (id 1) as eos too; the file says 2
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (1, 2, 2)
    assert ours.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False) == (
        theirs.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    )
