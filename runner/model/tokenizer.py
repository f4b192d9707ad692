"""The tokenizer and chat template stored in a GGUF file, built from the metadata the weights' reader already
holds (runner.model.gguf_file.GGUFCheckpoint), so a load reads the file once.

transformers builds a GGUF tokenizer in `AutoTokenizer.from_pretrained(directory, gguf_file=name)` by reading
the file twice more (once for a config, once for the vocabulary: two gguf-py GGUFReader passes of ~2 s each on
the CPU for the 135M model, measured with a counting GGUFReader). The same result comes from the pieces that
call uses: its table from GGUF keys to tokenizer fields (`integrations.ggml.GGUF_TOKENIZER_MAPPING`), its
converter to a `tokenizers` backend (`integrations.ggml.convert_gguf_tokenizer`) and the `TokenizersBackend`
class it returns; suites/runner/test_model_tokenizer.py checks the two agree (backend, template, ids).
transformers 5.17 sets the wrong special tokens for this file (eos_token = bos_token = "<|im_start|>", id 1,
although the file's tokenizer.ggml.eos_token_id is 2, "<|im_end|>", which is what the chat template ends a turn
with), so bos, eos and pad are set again from the file's ids.
"""

from __future__ import annotations

from collections.abc import Mapping


def gguf_tokenizer(
    metadata: Mapping[str, object],
    name: str,
    bos_token_id: int | None,
    eos_token_id: int | None,
    pad_token_id: int | None = None,
):
    """A transformers tokenizer with the file's chat template and special ids, from its metadata (every
    `tokenizer.*` key and `general.architecture`, as GGUFCheckpoint.tokenizer_metadata gives them); `name`
    (the file's) only words the errors."""
    from transformers import TokenizersBackend
    from transformers.integrations.ggml import GGUF_TO_FAST_CONVERTERS, GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer

    arch = metadata.get("general.architecture")
    if arch not in GGUF_TO_FAST_CONVERTERS:
        raise ValueError(f"model: {name} has a tokenizer of architecture {arch!r}, which transformers cannot build")
    fields, config = (
        {
            field: metadata[f"tokenizer.{key}"]
            for key, field in GGUF_TOKENIZER_MAPPING[part].items()
            if f"tokenizer.{key}" in metadata
        }
        for part in ("tokenizer", "tokenizer_config")
    )
    if "tokens" not in fields:
        raise ValueError(f"model: {name} carries no tokenizer (tokenizer.ggml.tokens)")
    backend, extra = convert_gguf_tokenizer(arch, fields)
    # a BPE tokenizer must not strip spaces before punctuation
    tok = TokenizersBackend(tokenizer_object=backend, **{**config, **extra, "clean_up_tokenization_spaces": False})
    for role, token_id in (("bos_token", bos_token_id), ("eos_token", eos_token_id), ("pad_token", pad_token_id)):
        if token_id is not None:
            setattr(tok, role, tok.convert_ids_to_tokens(int(token_id)))
    if not tok.chat_template:
        raise ValueError(f"model: {name} carries no tokenizer.chat_template")
    return tok
