"""Model definitions the runner executes: the Llama family over a paged KV cache (llama.py, loaded by
`load_model` from GGUF, an HF safetensors directory or dummy weights), and the tiny attention + Mamba2 hybrid
(random weights, pure torch) with its Mamba state offload and boundary rule. Where a model's weights come from
(runner.model.source) is pure Python: importing this package imports no torch until a model loads."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from runner.model.config import MODELS, LlamaConfig, registered
from runner.model.source import LOAD_FORMATS, gguf_path, resolve

if TYPE_CHECKING:
    import torch

DEFAULT_MODEL = "smollm2-135m-instruct"


def load_model(
    model: str = DEFAULT_MODEL,
    load_format: str = "auto",
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    seed: int = 0,
    tokenizer: bool = True,
    quantization: str | None = None,
    nvfp4_w13_policy: str = "use_w1",
):
    """(LlamaForCausalLM, tokenizer or None, LlamaConfig).

    model: a registered name (runner.model.config.MODELS), a .gguf file, or an HF directory (config.json +
    *.safetensors). load_format "auto" picks from that; "dummy" builds seeded random weights (`seed`) of the
    model's shape. device None: CUDA when present, else the CPU; dtype None: bf16 on CUDA, fp32 on the CPU.
    The tokenizer comes from the GGUF file (or the HF directory's tokenizer files); a dummy registered shape
    gets its family's tokenizer when that file is installed, else None. tokenizer=False: never load one
    (None). quantization: quantize the linear layers while the weights load ("fp8" | "fp8_block" | "mxfp4",
    runner.model.quant); None keeps the checkpoint's dtype. nvfp4_w13_policy: what an NVFP4 checkpoint's gate/up
    parts with different global scales become ("raise" | "use_w1" | "max_requant", reference.quant.nvfp4_fused_w13).
    """
    import torch

    from runner.model.llama import LlamaForCausalLM
    from runner.model.weights import dummy_weights, read_hf_config, safetensors_weights

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    fmt, path = resolve(model, load_format)
    want_tokenizer, tokenizer, weights = tokenizer, None, None
    progress = _Progress(model)  # a GGUF load takes ~5-15 s on a CPU: say what it is doing
    if path is None:
        config = registered(model).config
        source = registered(model).tokenizer_from or (model if registered(model).gguf else None)
        if want_tokenizer and source is not None and importlib.util.find_spec(registered(source).gguf[0]):
            from runner.model.gguf_file import GGUFCheckpoint

            progress.stage("tokenizer")
            tokenizer = _gguf_tokenizer(GGUFCheckpoint(gguf_path(source)))
    elif path.is_file():
        from runner.model.gguf_file import GGUFCheckpoint

        progress.stage("reading GGUF")
        checkpoint = GGUFCheckpoint(path)  # the one read of the file: config, tokenizer and weights
        config = checkpoint.config
        if want_tokenizer:
            progress.stage("tokenizer")
            tokenizer = _gguf_tokenizer(checkpoint)
        weights = checkpoint.weights() if fmt == "gguf" else None
        progress.total(len(checkpoint.tensor_names))
    else:
        config = read_hf_config(path)
        tokenizer = _hf_dir_tokenizer(path) if want_tokenizer else None
        weights = safetensors_weights(path) if fmt == "safetensors" else None
    if weights is None:
        weights = dummy_weights(config, seed=seed, device=device, dtype=dtype)
    quant = _checkpoint_quant(path) if path is not None and path.is_dir() else None
    if quantization is not None:
        from runner.model.quant import online_config

        if quant is not None:
            raise ValueError(f"quantization: {model} is a {quant.name} checkpoint already; leave quantization unset")
        quant = online_config(quantization)
    if quant is not None:
        import dataclasses

        from runner.model.weights import hf_tensor_shapes

        quant = dataclasses.replace(quant, w13_policy=nvfp4_w13_policy)
        shapes = hf_tensor_shapes(config)
        quant.check_layers({n.removesuffix(".weight") for n, s in shapes.items() if len(s) == 2})
    net = LlamaForCausalLM(config, dtype, device, quant)
    net.load_weights(progress.tensors(weights))
    progress.close()
    return net.eval(), tokenizer, config


def _checkpoint_quant(directory: Path):
    """The QuantConfig of an HF directory's quantized checkpoint (config.json's quantization_config, or
    ModelOpt's hf_quant_config.json), None for an unquantized one."""
    import json

    from runner.model.quant.checkpoint_config import from_checkpoint

    config = json.loads((directory / "config.json").read_text()) if (directory / "config.json").is_file() else {}
    if "quantization_config" in config:
        return from_checkpoint(config["quantization_config"])
    modelopt = directory / "hf_quant_config.json"
    return from_checkpoint(json.loads(modelopt.read_text())) if modelopt.is_file() else None


def load_frontend(model: str = DEFAULT_MODEL, load_format: str = "auto"):
    """(tokenizer or None, model config) without the weights: what a frontend needs to encode prompts and
    decode outputs while an engine-core process holds the model (one read of the GGUF metadata)."""
    _, path = resolve(model, load_format)
    if path is None:
        entry = registered(model)
        source = entry.tokenizer_from or (model if entry.gguf else None)
        if source is None or importlib.util.find_spec(registered(source).gguf[0]) is None:
            return None, entry.config
        from runner.model.gguf_file import GGUFCheckpoint

        return _gguf_tokenizer(GGUFCheckpoint(gguf_path(source))), entry.config
    if path.is_file():
        from runner.model.gguf_file import GGUFCheckpoint

        checkpoint = GGUFCheckpoint(path)
        return _gguf_tokenizer(checkpoint), checkpoint.config
    from runner.model.weights import read_hf_config

    return _hf_dir_tokenizer(path), read_hf_config(path)


class _Progress:
    """A load's progress on stderr: the stage, then a tensor count. tqdm's disable=None shows it only on a
    terminal, so tests, CI logs and piped output stay clean."""

    def __init__(self, model: str) -> None:
        from tqdm.auto import tqdm

        self._bar = tqdm(desc=f"loading {model}", unit=" tensors", disable=None, leave=False)

    def stage(self, name: str) -> None:
        self._bar.set_postfix_str(name)

    def total(self, count: int) -> None:
        self._bar.total = count
        self._bar.refresh()

    def tensors(self, weights):
        self._bar.set_postfix_str("weights")
        for item in weights:
            yield item
            self._bar.update()

    def close(self) -> None:
        self._bar.close()


def _gguf_tokenizer(checkpoint):
    from runner.model.tokenizer import gguf_tokenizer

    config = checkpoint.config
    pad = checkpoint.metadata.get("tokenizer.ggml.padding_token_id")
    return gguf_tokenizer(
        checkpoint.tokenizer_metadata(), checkpoint.path.name, config.bos_token_id, config.eos_token_id, pad
    )


def _hf_dir_tokenizer(path: Path):
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


__all__ = [
    "DEFAULT_MODEL",
    "LOAD_FORMATS",
    "MODELS",
    "LlamaConfig",
    "gguf_path",
    "load_frontend",
    "load_model",
    "resolve",
]
