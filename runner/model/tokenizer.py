"""The tokenizer and chat template stored in a GGUF file, through transformers' GGUF support.

`AutoTokenizer.from_pretrained(directory, gguf_file=name, local_files_only=True)` rebuilds a fast tokenizer
from the file's `tokenizer.ggml.*` vocabulary and merges and takes `tokenizer.chat_template`; it reads only
the local file (no hub look-up). transformers 5.17 sets the wrong special tokens for this file (eos_token =
bos_token = "<|im_start|>", id 1, although the file's tokenizer.ggml.eos_token_id is 2, "<|im_end|>", which
is what the chat template ends a turn with), so bos, eos and pad are set again from the file's ids.
"""

from __future__ import annotations

from pathlib import Path


def load_gguf_tokenizer(
    path: str | Path, bos_token_id: int | None, eos_token_id: int | None, pad_token_id: int | None = None
):
    """A transformers tokenizer with the file's chat template and special ids."""
    from transformers import AutoTokenizer

    path = Path(path)
    tok = AutoTokenizer.from_pretrained(
        str(path.parent), gguf_file=path.name, local_files_only=True, clean_up_tokenization_spaces=False
    )
    tok.clean_up_tokenization_spaces = False  # a BPE tokenizer must not strip spaces before punctuation
    for role, token_id in (("bos_token", bos_token_id), ("eos_token", eos_token_id), ("pad_token", pad_token_id)):
        if token_id is not None:
            setattr(tok, role, tok.convert_ids_to_tokens(int(token_id)))
    if not tok.chat_template:
        raise ValueError(f"model: {path.name} carries no tokenizer.chat_template")
    return tok
